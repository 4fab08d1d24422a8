"""Reasoning in a chat reply: the thinking a reasoning model writes before its answer, split out as
`reasoning_content` (llama-server's --reasoning-format, vLLM's --reasoning-parser), whole or as it
streams. Each parser is one model family's spelling of a thought: `<think>...</think>` (DeepSeek-R1,
Qwen3, GLM, ERNIE), `[THINK]...[/THINK]` (Magistral), `<seed:think>...</seed:think>` (Seed-OSS),
Granite's "Here is my thought process:" ... "Here is my response:", or gpt-oss's harmony channels
(harmony.py). The chat template tells which one a model uses ("auto")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

from .harmony import HarmonySplitter, is_harmony_template


@dataclass(frozen=True)
class ThinkTags:
    """A thought spelled open ... close. starts_open: a reply is in its thought from the first
    token whether or not it writes the opening tag (DeepSeek-R1 replies, whose templates open the
    thought in the prompt). special: the tags are special tokens, whose text the detokenizer must
    keep."""
    open: str
    close: str
    starts_open: bool = False
    special: bool = False


_THINK = ThinkTags("<think>", "</think>")
# vLLM's --reasoning-parser names, llama.cpp's --reasoning-format names, and spellings of both.
PARSERS = {
    "deepseek_r1": ThinkTags("<think>", "</think>", starts_open=True),
    "qwen3": _THINK, "glm45": _THINK, "ernie45": _THINK, "hunyuan_a13b": _THINK, "step3": _THINK,
    "mistral": ThinkTags("[THINK]", "[/THINK]", special=True),
    "seed_oss": ThinkTags("<seed:think>", "</seed:think>"),
    "granite": ThinkTags("Here is my thought process:", "Here is my response:"),
    "gpt_oss": None,    # harmony channels
}
_ALIASES = {"deepseek": "auto", "deepseek-r1": "deepseek_r1", "deepseek-legacy": "auto", "gpt-oss": "gpt_oss",
            "harmony": "gpt_oss", "seed-oss": "seed_oss", "magistral": "mistral"}
CHOICES = ("auto", "none", *PARSERS, *_ALIASES)


def _canonical(name: str) -> str:
    if name not in CHOICES:
        raise ValueError(f"reasoning parser {name!r} is not one of {', '.join(CHOICES)}")
    return _ALIASES.get(name, name)


class ReasoningParser:
    """One way of spelling thoughts (a name of CHOICES other than "auto": use for_template).
    "none" leaves every reply whole as content."""

    def __init__(self, name: str):
        name = _canonical(name)
        if name == "auto":
            raise ValueError("ReasoningParser('auto'): the chat template decides; use ReasoningParser.for_template")
        self.name = name
        self.tags: Optional[ThinkTags] = PARSERS.get(name)

    @classmethod
    def for_template(cls, source: str, name: str = "auto") -> "ReasoningParser":
        """name's parser, or for "auto" the spelling the chat template teaches (none when it writes
        no thoughts)."""
        name = _canonical(name)
        if name != "auto":
            return cls(name)
        if is_harmony_template(source):
            return cls("gpt_oss")
        for candidate in ("seed_oss", "mistral", "granite"):
            if PARSERS[candidate].open in source:
                return cls(candidate)
        return cls("qwen3" if _THINK.open in source else "none")

    @property
    def active(self) -> bool:
        return self.name != "none"

    @property
    def keeps_special(self) -> bool:
        """Whether replies must keep special tokens' text (the markers are special tokens)."""
        return self.name == "gpt_oss" or bool(self.tags and self.tags.special)

    def starts_in_thought(self, prompt: str) -> bool:
        """Whether a reply to prompt begins inside a thought: the template opened it (Qwen3's
        thinking models, DeepSeek-R1's newer templates), or the parser says replies always do."""
        if self.tags is None:
            return False
        return self.tags.starts_open or prompt.rstrip().endswith(self.tags.open)

    def splitter(self, prompt: str = ""):
        """A streaming splitter for a reply to prompt: feed(text) -> (content, reasoning) deltas,
        finish() -> the rest; None for "none"."""
        if self.name == "gpt_oss":
            return HarmonySplitter()
        if self.tags is None:
            return None
        return ThinkSplitter(self.tags, self.starts_in_thought(prompt))

    def thinking_tokens(self, prompt: str, token_ids: Sequence[int], tokenizer) -> int:
        """How many of a reply's tokens (to prompt) are its thinking, as usage's reasoning_tokens
        counts them: the tokens before its answer begins, the marker that closes the thought (and a
        harmony answer's header) included; all of them where the thought never closes; 0 for a reply
        that does not think. tokenizer: the `_ember.Tokenizer` whose ids these are."""
        from ..detokenize import Detokenizer

        splitter = self.splitter(prompt)
        if splitter is None:
            return 0
        detok = Detokenizer(tokenizer, special=self.keeps_special)
        thought = False
        for n, token in enumerate(token_ids):
            start = detok.push(token, find_stops=False)
            _, reasoning = splitter.feed(detok.text[start:])
            thought = thought or bool(reasoning) or splitter.in_thought
            if splitter.answering:
                return n + 1 if thought else 0
        return len(token_ids) if thought else 0

    def split(self, text: str, prompt: str = "") -> Tuple[str, str]:
        """A whole reply's (content, reasoning)."""
        s = self.splitter(prompt)
        if s is None:
            return text, ""
        content, reasoning = s.feed(text)
        c, r = s.finish()
        return content + c, reasoning + r


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest proper prefix of tag that ends text."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ThinkSplitter:
    """A reply in open/close tags, streamed. Whitespace around a thought is trimmed (the template's
    newlines after <think> and the model's before the answer), so a streamed split and a whole one
    agree; text that may grow into a tag is held back until it does or cannot."""

    def __init__(self, tags: ThinkTags, in_thought: bool):
        self._tags = tags
        self._buf = ""
        # start: the reply may still open a thought; thought; answer.
        self._state = "thought" if in_thought else "start"
        self._lead = True       # nothing of the current part (thought or answer) given out yet
        self._held_space = ""   # a thought's trailing whitespace, given out only if text follows it

    @property
    def in_thought(self) -> bool:
        return self._state == "thought"

    @property
    def answering(self) -> bool:
        return self._state == "answer"

    def feed(self, text: str) -> Tuple[str, str]:
        self._buf += text
        content, reasoning = [], []
        while self._step(content, reasoning, final=False):
            pass
        return "".join(content), "".join(reasoning)

    def finish(self) -> Tuple[str, str]:
        """The rest at the end of the reply: a held-back partial tag is text after all; a thought
        never closed is all reasoning."""
        content, reasoning = [], []
        while self._step(content, reasoning, final=True):
            pass
        return "".join(content), "".join(reasoning)

    def _emit(self, out: list, text: str) -> None:
        if self._lead:
            text = text.lstrip()
            if not text:
                return
            self._lead = False
        out.append(text)

    def _step(self, content: list, reasoning: list, final: bool) -> bool:
        tags, buf = self._tags, self._buf
        if self._state == "start":
            head = buf.lstrip()
            if head.startswith(tags.open):
                self._buf = head[len(tags.open):]
                self._state, self._lead = "thought", True
                return True
            if not final and tags.open.startswith(head):
                return False    # whitespace, or the start of the opening tag
            self._state = "answer"
            return True
        if self._state == "answer":
            if buf:
                self._emit(content, buf)
                self._buf = ""
            return False
        if self._lead:   # a template that opened the thought may see the model open it again
            head = buf.lstrip()
            if head.startswith(tags.open):
                self._buf = buf = head[len(tags.open):]
            elif not final and tags.open.startswith(head) and head:
                return False
        i = buf.find(tags.close)
        if i >= 0:
            self._think(reasoning, buf[:i], closing=True)
            self._buf = buf[i + len(tags.close):]
            self._state, self._lead, self._held_space = "answer", True, ""
            return True
        keep = 0 if final else _partial_suffix(buf, tags.close)
        self._think(reasoning, buf[:len(buf) - keep], closing=final)
        self._buf = buf[len(buf) - keep:]
        return False

    def _think(self, reasoning: list, text: str, closing: bool) -> None:
        """Thought text; its trailing whitespace waits for more (dropped where the thought ends)."""
        text = self._held_space + text
        body = text.rstrip()
        self._held_space = "" if closing else text[len(body):]
        if body:
            self._emit(reasoning, body)
