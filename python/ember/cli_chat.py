"""The `ember` command's two conversations: -cnv / --chat (turns rendered by the model's chat
template, a system prompt with -sys) and -i (raw text that the user and the model extend in turn,
as llama-cli -i). A line ending in a backslash goes on on the next line; /exit or end of input
stops; Ctrl-C during a reply cuts it short and gives the turn back."""
from __future__ import annotations

import sys
from typing import Callable, Iterator, Optional

CONTINUE = "\\"
EXIT = "/exit"


def read_turn(read_line: Callable[[str], Optional[str]], prompt: str) -> Optional[str]:
    """One turn of user input: lines joined while they end in a backslash (which is dropped);
    None at the end of input. read_line(prompt) returns a line without its newline, or None."""
    lines = []
    while True:
        line = read_line(prompt if not lines else "")
        if line is None:
            return "\n".join(lines) if lines else None
        if line.endswith(CONTINUE):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


def line_reader(stream) -> Callable[[str], Optional[str]]:
    """read_line for read_turn: input() with its line editing on a terminal, else the stream's lines."""
    if stream.isatty():
        def from_terminal(prompt: str) -> Optional[str]:
            try:
                return input(prompt)
            except EOFError:
                return None
        return from_terminal

    def from_stream(prompt: str) -> Optional[str]:
        line = stream.readline()
        return line.rstrip("\n") if line else None
    return from_stream


def _show(pieces: Iterator[str], out, interactive: bool) -> str:
    """Writes the pieces as they come; returns the text. Ctrl-C ends the reply on a terminal."""
    text = []
    try:
        for piece in pieces:
            out.write(piece)
            out.flush()
            text.append(piece)
    except KeyboardInterrupt:
        if not interactive:
            raise
    out.write("\n")
    out.flush()
    return "".join(text)


def chat(llm, sampling: dict, max_tokens: Optional[int], system_prompt: Optional[str], stdin=sys.stdin,
         out=sys.stdout) -> int:
    """-cnv: each turn goes through the chat template with the whole conversation so far."""
    interactive = stdin.isatty()
    read_line = line_reader(stdin)
    if interactive:
        print("ember chat: /exit or Ctrl-D ends it; end a line with \\ to go on on the next one", file=sys.stderr)
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    while True:
        turn = read_turn(read_line, "> " if interactive else "")
        if turn is None or turn.strip() == EXIT:
            return 0
        if not turn.strip():
            continue
        messages.append({"role": "user", "content": turn})
        stream = llm.create_chat_completion(messages, stream=True, max_tokens=max_tokens, **sampling)
        reply = _show((c["choices"][0]["delta"].get("content") or "" for c in stream), out, interactive)
        messages.append({"role": "assistant", "content": reply})


def interactive(llm, sampling: dict, max_tokens: Optional[int], prompt: str, stdin=sys.stdin, out=sys.stdout) -> int:
    """-i: the text so far is completed, then the user's input is appended to it, in turn."""
    is_tty = stdin.isatty()
    read_line = line_reader(stdin)
    text = prompt

    def complete():
        nonlocal text
        stream = llm.create_completion(text, stream=True, max_tokens=max_tokens, **sampling)
        text += _show((c["choices"][0]["text"] for c in stream), out, is_tty)
    if prompt:
        out.write(prompt)
        complete()
    while True:
        turn = read_turn(read_line, "> " if is_tty else "")
        if turn is None or turn.strip() == EXIT:
            return 0
        text += turn + "\n"
        complete()
