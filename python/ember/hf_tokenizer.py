"""`HFTokenizer`: the part of a Hugging Face tokenizer's API that code written for vLLM calls on
`LLM.get_tokenizer()` (encode, decode, apply_chat_template, the special token ids), over the
GGUF's own tokenizer and chat template."""
from __future__ import annotations

from typing import List, Optional, Tuple, Union

from .chat import ChatTemplate, token_text


class HFTokenizer:
    """tokenizer: an `_ember.Tokenizer`; model_path: the GGUF whose chat template
    apply_chat_template renders (read at its first use)."""

    def __init__(self, tokenizer, model_path: str):
        self._tok = tokenizer
        self._model_path = model_path
        self._template: Optional[ChatTemplate] = None

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._tok.bos if self._tok.bos >= 0 else None

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._tok.eos if self._tok.eos >= 0 else None

    @property
    def bos_token(self) -> Optional[str]:
        return token_text(self._tok, self._tok.bos)

    @property
    def eos_token(self) -> Optional[str]:
        return token_text(self._tok, self._tok.eos)

    @property
    def vocab_size(self) -> int:
        return self._tok.n_vocab

    def __len__(self) -> int:
        return self._tok.n_vocab

    @property
    def chat_template(self) -> str:
        return self._chat_template().source

    def _chat_template(self) -> ChatTemplate:
        if self._template is None:
            self._template = ChatTemplate.for_model(self._model_path, self._tok)
        return self._template

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of text; special tokens written in it are read as such (as HF's are), and
        add_special_tokens adds BOS where the model asks for one."""
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
        return list(self._tok.encode(text.encode("utf-8"), add_special_tokens, True))

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        ids = [int(t) for t in token_ids]
        bad = next((t for t in ids if not 0 <= t < self._tok.n_vocab), None)
        if bad is not None:
            raise ValueError(f"decode: token id {bad} is outside the vocabulary of {self._tok.n_vocab}")
        return bytes(self._tok.decode(ids, not skip_special_tokens)).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids: Union[int, List[int]]):
        """The vocabulary's spelling of each id (a single id gives a single token)."""
        if isinstance(ids, int):
            return token_text(self._tok, ids)
        return [token_text(self._tok, int(t)) for t in ids]

    def apply_chat_template(self, conversation: List[dict], tools=None, chat_template: Optional[str] = None,
                            add_generation_prompt: bool = False, tokenize: bool = True, **kwargs):
        """The conversation rendered by the model's chat template (or chat_template, Jinja text),
        as text (tokenize=False) or token ids. Other keyword arguments reach the template."""
        text, ids = self.render_chat(conversation, tools=tools, chat_template=chat_template,
                                     add_generation_prompt=add_generation_prompt, **kwargs)
        return ids if tokenize else text

    def render_chat(self, conversation: List[dict], tools=None, chat_template: Optional[str] = None,
                    add_generation_prompt: bool = True, **kwargs) -> Tuple[str, List[int]]:
        """The rendered text and its token ids: the template's markers read as special tokens, BOS
        added only where the template did not write it (as ember-server tokenizes a chat)."""
        if not isinstance(conversation, (list, tuple)) or not all(isinstance(m, dict) for m in conversation):
            raise ValueError(f"a conversation is a list of message dicts, got {conversation!r:.80}")
        template = (self._chat_template() if chat_template is None else
                    ChatTemplate.for_model(self._model_path, self._tok, source=chat_template))
        text = template.render(list(conversation), add_generation_prompt=add_generation_prompt, tools=tools, **kwargs)
        return text, list(self._tok.encode(text.encode("utf-8"), template.add_bos(text), True))
