"""The `ember` command: load a GGUF model and stream a completion of a prompt to stdout
(ember -m MODEL -p PROMPT | -f FILE | prompt on stdin, -n N [--temp T] [--seed S] [-c N_CTX] ...), or
talk with it: -cnv / --chat through its chat template (-sys: a system prompt), -i on raw text.
`ember --system-info` says what this build runs on. The options shared with the other tools are
docs/options.md's."""
from __future__ import annotations

import argparse
import signal
import sys
from typing import Callable, List, Optional

from . import options
from .cli_chat import chat, interactive
from .llama import Llama
from .version import add_version, system_info


def _describe(e: BaseException) -> str:
    """An exception as the one line after `NAME: error: `."""
    if isinstance(e, MemoryError):
        return f"out of memory ({e})" if str(e) else "out of memory"
    if isinstance(e, OSError) and e.strerror:
        return f"{e.filename}: {e.strerror}" if e.filename else e.strerror
    text = " ".join(str(e).split())
    if text and (isinstance(e, (ValueError, RuntimeError, OSError)) or type(e).__module__.startswith("ember.")):
        return text
    # Anything else (TypeError, KeyError...): the message alone would not say what it is.
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def run_tool(prog: str, body: Callable[[], int]) -> int:
    """How every ember command ends: body's status; 1 with one line `PROG: error: ...` on stderr
    for any failure (never a traceback); 130 on Ctrl-C. When the reader of stdout goes away
    (`ember ... | head`) the process dies of SIGPIPE, silently, as cat or grep do: the shell
    reports 141, so `set -o pipefail` still sees that the output was cut short."""
    try:
        return body()
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.raise_signal(signal.SIGPIPE)
        raise   # reached only where SIGPIPE is blocked, so its default action could not end the process
    except Exception as e:
        print(f"{prog}: error: {_describe(e)}", file=sys.stderr)
        return 1


class _SystemInfo(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(system_info())
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ember", description="Complete a prompt with a GGUF model, or chat with it.")
    given = p.add_mutually_exclusive_group()
    given.add_argument("-p", "--prompt", help="the prompt text (none: -f, or the text on stdin)")
    given.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE")
    p.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate, per reply in a conversation (<= 0: until end of generation or a "
                        "full context)")
    p.add_argument("--echo", action="store_true", help="print the prompt before the completion")
    talk = p.add_mutually_exclusive_group()
    talk.add_argument("-cnv", "--conversation", "--chat", dest="conversation", action="store_true",
                      help="chat: each line you type is a user turn, rendered by the model's chat template (a "
                           "line ending in \\ goes on on the next; /exit or Ctrl-D ends it)")
    talk.add_argument("-i", "--interactive", action="store_true",
                      help="after the completion, what you type is appended to the text and completed in turn")
    p.add_argument("-sys", "--system-prompt", metavar="TEXT",
                   help="with -cnv: the conversation's system prompt (-p TEXT there means the same, as in llama-cli)")
    p.add_argument("--system-info", action=_SystemInfo,
                   help="print the SIMD level, the backends built in and the CUDA devices, then exit")
    add_version(p)
    options.add_arguments(p, options.EMBER)
    return p


def _prompt(args) -> str:
    if args.prompt is not None:
        return args.prompt
    if args.file is not None:
        with open(args.file, encoding="utf-8") as f:
            return f.read()
    if args.interactive:
        return ""
    if sys.stdin.isatty():
        raise ValueError("no prompt: give -p TEXT, -f FILE or the text on stdin (or -cnv to chat)")
    return sys.stdin.read()


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    return run_tool("ember", lambda: _complete(args))


def _complete(args) -> int:
    if args.system_prompt is not None and not args.conversation:
        raise ValueError("-sys / --system-prompt is for a chat: add -cnv")
    prompt = None if args.conversation else _prompt(args)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                    repeat_penalty=args.repeat_penalty)
    max_tokens = args.n_predict if args.n_predict > 0 else None
    with Llama(args.model, **options.values(args, options.LLAMA)) as llm:
        if args.conversation:
            return chat(llm, sampling, max_tokens, args.system_prompt or args.prompt)
        if args.interactive:
            return interactive(llm, sampling, max_tokens, prompt)
        chunks = llm.create_completion(prompt, max_tokens=args.n_predict, echo=args.echo, stream=True, **sampling)
        for chunk in chunks:
            sys.stdout.write(chunk["choices"][0]["text"])
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
