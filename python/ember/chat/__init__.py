"""Chat, as the library owns it for `Llama`, `LLM` and ember-server alike: rendering messages with
the model's chat template (template.py), reading tool calls out of a reply (tool_calls.py), and
llama-cpp-python's chat result dicts (results.py).

A reply is read in order: reasoning first (gpt-oss's harmony channels: harmony.py), then tool calls
from what is left."""
from .results import chat_chunks, chat_completion
from .template import CHATML, ChatTemplate, ChatTemplateError, TemplateBudgetError, token_text
from .tool_calls import ToolCallParser, arguments_as_objects

__all__ = ["CHATML", "ChatTemplate", "ChatTemplateError", "TemplateBudgetError", "ToolCallParser",
           "arguments_as_objects", "chat_chunks", "chat_completion", "token_text"]
