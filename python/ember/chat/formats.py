"""llama-cpp-python's `chat_format` names for the prompt formats of common model families, each a
Jinja template that ChatTemplate runs; `Llama(chat_format=None)` uses the GGUF's own template,
which is what the model was trained on and the better choice wherever the file has one."""
from __future__ import annotations

from typing import Dict

from .template import CHATML

_LLAMA2 = ("{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' else none %}"
           "{%- for message in messages if message['role'] != 'system' %}"
           "{%- if message['role'] == 'user' %}{{ bos_token }}[INST] "
           "{%- if loop.first and system %}<<SYS>>\n{{ system }}\n<</SYS>>\n\n{% endif %}"
           "{{ message['content'] }} [/INST]"
           "{%- else %} {{ message['content'] }} {{ eos_token }}{%- endif %}"
           "{%- endfor %}")

_LLAMA3 = ("{{ bos_token }}{%- for message in messages %}"
           "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n{{ message['content'] }}<|eot_id|>"
           "{%- endfor %}"
           "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}")

_MISTRAL = ("{{ bos_token }}{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' "
            "else none %}"
            "{%- for message in messages if message['role'] != 'system' %}"
            "{%- if message['role'] == 'user' %}[INST] {% if loop.first and system %}{{ system }}\n\n{% endif %}"
            "{{ message['content'] }} [/INST]"
            "{%- else %}{{ message['content'] }}{{ eos_token }}{%- endif %}"
            "{%- endfor %}")

_GEMMA = ("{{ bos_token }}{%- set system = messages[0]['content'] if messages and messages[0]['role'] == 'system' "
          "else none %}"
          "{%- for message in messages if message['role'] != 'system' %}"
          "<start_of_turn>{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
          "{%- if loop.first and system %}{{ system }}\n\n{% endif %}{{ message['content'] }}<end_of_turn>\n"
          "{%- endfor %}"
          "{%- if add_generation_prompt %}<start_of_turn>model\n{%- endif %}")

_ZEPHYR = ("{%- for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
           "{%- endfor %}"
           "{%- if add_generation_prompt %}<|assistant|>\n{%- endif %}")

_VICUNA = ("{%- for message in messages %}"
           "{%- if message['role'] == 'system' %}{{ message['content'] }} "
           "{%- elif message['role'] == 'user' %}USER: {{ message['content'] }} "
           "{%- else %}ASSISTANT: {{ message['content'] }}{{ eos_token }}{%- endif %}"
           "{%- endfor %}"
           "{%- if add_generation_prompt %}ASSISTANT: {%- endif %}")

# Names as llama-cpp-python spells them (and the spellings its users pass).
FORMATS: Dict[str, str] = {
    "chatml": CHATML, "qwen": CHATML, "llama-2": _LLAMA2, "llama-3": _LLAMA3, "mistral-instruct": _MISTRAL,
    "mistral": _MISTRAL, "gemma": _GEMMA, "zephyr": _ZEPHYR, "vicuna": _VICUNA,
}


def chat_format_template(name: str) -> str:
    """The Jinja template of a chat_format name; ValueError listing the names for another."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"chat_format {name!r} is not one of {', '.join(sorted(FORMATS))} (None: the GGUF's own "
                         f"template)") from None
