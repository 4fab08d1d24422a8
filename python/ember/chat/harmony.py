"""gpt-oss's harmony replies split into content and reasoning: each message of a reply is
`<|channel|>NAME<|message|>TEXT` ended by <|end|>, <|return|> or <|call|>, the next one opened by
<|start|>ROLE. The analysis channel is reasoning (reasoning_content); the others (final, and
commentary's preambles) are content. A reply with no harmony markup is all content.
HarmonySplitter does it as text streams in, holding back what may be the start of a marker."""
from __future__ import annotations

from typing import List, Tuple

_OPEN_CHANNEL, _MESSAGE, _START = "<|channel|>", "<|message|>", "<|start|>"
_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_MARKERS = (_OPEN_CHANNEL, _MESSAGE, _START, "<|constrain|>") + _ENDS
REASONING_CHANNELS = ("analysis",)


def is_harmony_template(source: str) -> bool:
    """Whether a chat template writes harmony messages (gpt-oss's)."""
    return _OPEN_CHANNEL in source and _MESSAGE in source and "<|start|>assistant" in source


def _partial_marker(tail: str) -> bool:
    return any(m.startswith(tail) for m in _MARKERS)


class HarmonySplitter:
    """feed(text) -> (content, reasoning) deltas; finish() returns what was held back."""

    def __init__(self):
        self._buf = ""
        self._state = "start"      # start: not yet known to be harmony; header: before <|message|>; body
        self._reasoning = False    # the current body's channel is a reasoning one

    @property
    def in_thought(self) -> bool:
        return self._state == "body" and self._reasoning

    @property
    def answering(self) -> bool:
        return self._state == "body" and not self._reasoning

    def feed(self, text: str) -> Tuple[str, str]:
        self._buf += text
        out: List[Tuple[bool, str]] = []
        while self._step(out):
            pass
        return self._join(out)

    def finish(self) -> Tuple[str, str]:
        """The rest at the end of the reply: a held-back partial marker is text after all; an
        unfinished header is dropped."""
        out: List[Tuple[bool, str]] = []
        if self._state in ("start", "body") and self._buf:
            out.append((self._reasoning, self._buf))
        self._buf = ""
        return self._join(out)

    @staticmethod
    def _join(out):
        return "".join(t for r, t in out if not r), "".join(t for r, t in out if r)

    def _step(self, out) -> bool:
        buf = self._buf
        if self._state == "start":
            if buf.startswith((_OPEN_CHANNEL, _START)):
                self._state = "header"
                return True
            if buf and not _partial_marker(buf):
                self._state = "body"
                return True
            return False
        if self._state == "header":
            i = buf.find(_MESSAGE)
            if i < 0:
                return False
            header = buf[:i]
            c = header.find(_OPEN_CHANNEL)
            channel = header[c + len(_OPEN_CHANNEL):].split("<|")[0].split(" ")[0].strip() if c >= 0 else ""
            self._reasoning = channel in REASONING_CHANNELS
            self._buf = buf[i + len(_MESSAGE):]
            self._state = "body"
            return True
        i = buf.find("<|")
        while i >= 0:
            rest = buf[i:]
            marker = next((m for m in _MARKERS if rest.startswith(m)), None)
            if marker is not None:
                if buf[:i]:
                    out.append((self._reasoning, buf[:i]))
                self._buf = buf[i:] if marker == _START or marker == _OPEN_CHANNEL else buf[i + len(marker):]
                if marker in _ENDS or marker in (_START, _OPEN_CHANNEL):
                    self._state = "header"
                return True
            if _partial_marker(rest):
                if buf[:i]:
                    out.append((self._reasoning, buf[:i]))
                self._buf = rest
                return False
            i = buf.find("<|", i + 2)
        keep = 1 if buf.endswith("<") else 0   # the first character of a marker to come
        if len(buf) > keep:
            out.append((self._reasoning, buf[:len(buf) - keep]))
        self._buf = buf[len(buf) - keep:]
        return False


def split_harmony(text: str) -> Tuple[str, str]:
    """A whole reply's (content, reasoning)."""
    s = HarmonySplitter()
    content, reasoning = s.feed(text)
    c, r = s.finish()
    return content + c, reasoning + r
