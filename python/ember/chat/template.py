"""Chat templates: turning OpenAI chat messages into one prompt string, as Hugging Face's
`apply_chat_template` does. The GGUF's `tokenizer.chat_template` (or a template file)
runs in Jinja2's immutable sandbox with HF's environment: `raise_exception`, `strftime_now`, a
`tojson` that keeps non-ASCII text, the `{% generation %}` tag, trim_blocks/lstrip_blocks, and
the variables messages, tools, documents, add_generation_prompt, bos_token and eos_token. A model
without a template gets ChatML, and the log says so."""
from __future__ import annotations

import datetime
import json
import logging
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


class ChatTemplateError(ValueError):
    """The template refused the messages (its raise_exception) or failed on them: the request's fault."""


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


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def token_text(tokenizer, tid: int) -> Optional[str]:
    """The vocabulary's spelling of token tid (an _ember.Tokenizer's), None for no token (tid < 0)."""
    return bytes(tokenizer.token_text(tid)).decode("utf-8", errors="replace") if tid >= 0 else None


class ChatTemplate:
    """One compiled template. source: the Jinja text; origin: where it came from, for the log."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "", origin: str = "template"):
        self.source = source
        self.origin = origin
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
        the template raises or fails on these messages."""
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs}
        variables.update(messages=arguments_as_objects(messages, self.source), tools=tools, documents=documents,
                         add_generation_prompt=add_generation_prompt)
        try:
            return self._template.render(**variables)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat template: {e.message or e}") from e
        except (TypeError, KeyError, IndexError, AttributeError, ValueError) as e:
            raise ChatTemplateError(f"chat template failed on these messages: {type(e).__name__}: {e}") from e
