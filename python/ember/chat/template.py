"""Chat templates: turning OpenAI chat messages into one prompt string, as Hugging Face's
`apply_chat_template` does. The GGUF's `tokenizer.chat_template` (or a template file)
runs in Jinja2's immutable sandbox with HF's environment: `raise_exception`, `strftime_now`, a
`tojson` that keeps non-ASCII text, the `{% generation %}` tag, trim_blocks/lstrip_blocks, and
the variables messages, tools, documents, add_generation_prompt, bos_token and eos_token. A model
without a template gets ChatML, and the log says so. A template comes from a GGUF or a file, not
always a trusted one: each rendering has a time and an output budget (TemplateBudgetError)."""
from __future__ import annotations

import datetime
import json
import logging
import sys
import time
from typing import Optional

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .. import _ember
from .tool_calls import arguments_as_objects

log = logging.getLogger(__name__)

CHATML = ("{%- for message in messages %}"
          "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


RENDER_SECONDS = 5.0          # a chat template renders in milliseconds; one that loops for seconds is broken
RENDER_CHARS = 64 << 20       # a prompt far beyond any context, yet far below what would exhaust memory


class ChatTemplateError(ValueError):
    """The template refused the messages (its raise_exception) or failed on them: the request's fault."""


class TemplateBudgetError(RuntimeError):
    """A rendering ran past its time or output budget: the template's fault (or a request far too large)."""


class _Budget:
    """The budget of one rendering: output counted as it is produced, time checked on the lines
    the compiled template runs (sys.settrace in this thread, for template code only), so an empty
    loop of a billion iterations stops too."""

    _CHECK_EVERY = 1024   # trace events between clock reads

    def __init__(self, origin: str, seconds: float, chars: int):
        self.origin, self.seconds, self.chars = origin, seconds, chars
        self.deadline = time.monotonic() + seconds
        self._events = 0

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(f"the chat template ({self.origin}) ran for more than {self.seconds:g} s "
                                      f"on these messages")

    def check_size(self, n: int) -> None:
        if n > self.chars:
            raise TemplateBudgetError(f"the chat template ({self.origin}) wrote more than {self.chars} characters "
                                      f"on these messages")

    def _line(self, frame, event, arg):
        self._events += 1
        if self._events % self._CHECK_EVERY == 0:
            self.check_time()
        return self._line

    def _call(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def render(self, template, variables: dict) -> str:
        out, size = [], 0
        previous = sys.gettrace()
        sys.settrace(self._call)
        try:
            for piece in template.generate(**variables):
                size += len(piece)
                self.check_size(size)
                out.append(piece)
        finally:
            sys.settrace(previous)
        self.check_time()
        return "".join(out)


_TEMPLATE_FILE = "<template>"   # the file name Jinja gives code compiled from_string


class _GenerationTag(Extension):
    """HF's `{% generation %}...{% endgeneration %}` (it marks the assistant's tokens for training
    masks); rendering the body unchanged is what it does at inference."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _render_body(caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF's: unlike Jinja's own tojson, no HTML escaping, and non-ASCII text stays as it is.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with `*` and `**` refused where one operation would build a value past the
    output budget (a string or list repeated, a power of thousands of digits) in one C call."""
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > RENDER_CHARS:
                    raise TemplateBudgetError(f"the chat template repeats a value of {len(seq)} items {times} times, "
                                              f"more than {RENDER_CHARS} in all")
        if operator == "**" and isinstance(right, int) and abs(right) > 4096 and not isinstance(left, float):
            raise TemplateBudgetError(f"the chat template raises to the power {right}, past what a template needs")
        return super().call_binop(context, operator, left, right)


def _environment() -> ImmutableSandboxedEnvironment:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                              extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def token_text(tokenizer, tid: int) -> Optional[str]:
    """The vocabulary's spelling of token tid (an _ember.Tokenizer's), None for no token (tid < 0)."""
    return bytes(tokenizer.token_text(tid)).decode("utf-8", errors="replace") if tid >= 0 else None


class ChatTemplate:
    """One compiled template. source: the Jinja text; origin: where it came from, for the log and
    errors; each render() may run for budget_s seconds and write budget_chars characters (None:
    RENDER_SECONDS, RENDER_CHARS)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", origin: str = "template",
                 budget_s: Optional[float] = None, budget_chars: Optional[int] = None):
        self.source = source
        self.origin = origin
        self.budget_s = RENDER_SECONDS if budget_s is None else budget_s
        self.budget_chars = RENDER_CHARS if budget_chars is None else budget_chars
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ValueError(f"the chat template ({origin}) does not parse: {e.message} (line {e.lineno})") from e

    @classmethod
    def for_model(cls, model_path: str, tokenizer, override_file: Optional[str] = None,
                  source: Optional[str] = None) -> "ChatTemplate":
        """The template of the GGUF at model_path, override_file's or the Jinja text source instead
        when given, ChatML when the model has none. tokenizer (an _ember.Tokenizer) gives bos_token
        and eos_token."""
        special = dict(bos_token=token_text(tokenizer, tokenizer.bos) or "",
                       eos_token=token_text(tokenizer, tokenizer.eos) or "")
        if source is not None:
            return cls(source, origin="the chat_template argument", **special)
        if override_file:
            with open(override_file, encoding="utf-8") as f:
                return cls(f.read(), origin=override_file, **special)
        source = _ember.GGUFFile(model_path).get_string("tokenizer.chat_template", "")
        if not source:
            log.warning("%s has no tokenizer.chat_template: chat prompts use ChatML", model_path)
            return cls(CHATML, origin="ChatML fallback", **special)
        return cls(source, origin=f"{model_path}: tokenizer.chat_template", **special)

    def add_bos(self, prompt: str) -> bool:
        """Whether a rendered prompt is tokenized with the model's BOS: not when the template wrote
        it already (a second BOS degrades the output)."""
        return not (self.bos_token and prompt.startswith(self.bos_token))

    def render(self, messages, /, *, add_generation_prompt: bool = True, tools=None, documents=None, **kwargs) -> str:
        """The prompt for messages (a list of {"role", "content", ...} dicts). kwargs go to the
        template as further variables (vLLM's chat_template_kwargs); they cannot replace the
        named ones. An assistant message's tool call arguments, a JSON string from OpenAI clients,
        reach the template as an object, as Hugging Face templates expect. ChatTemplateError when
        the template raises or fails on these messages, TemplateBudgetError when it runs past its
        time or output budget."""
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        variables.update(messages=arguments_as_objects(messages, self.source), tools=tools, documents=documents,
                         add_generation_prompt=add_generation_prompt)
        try:
            return _Budget(self.origin, self.budget_s, self.budget_chars).render(self._template, variables)
        except TemplateBudgetError as e:
            if self.origin not in str(e):
                raise TemplateBudgetError(f"the chat template ({self.origin}): {e}") from None
            raise
        except RecursionError:
            raise TemplateBudgetError(f"the chat template ({self.origin}) recursed too deeply") from None
        except MemoryError:
            raise TemplateBudgetError(f"the chat template ({self.origin}) ran out of memory") from None
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e.message or e}") from e
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {type(e).__name__}: {e}") from e
