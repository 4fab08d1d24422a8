"""ember.chat.template: GGUF chat templates rendered with Hugging Face's semantics. SmolLM2's
own template against transformers' apply_chat_template (tests/reference/hf, or live with hf_live),
raise_exception, add_generation_prompt,
strftime_now, tojson, tools, the {% generation %} tag, the sandbox, the --chat-template override
and the ChatML fallback of a model without a template."""
import datetime
import logging

import pytest

import hf_tiny
from hf_tiny import hf_reference  # noqa: F401 (a fixture)
from ember import _ember
from ember.chat import CHATML, ChatTemplate, ChatTemplateError

MESSAGES = hf_tiny.CHAT_MESSAGES


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return _ember.Tokenizer.from_gguf_file(smollm2_path)


@pytest.fixture(scope="module")
def smollm2(smollm2_path, tokenizer):
    return ChatTemplate.for_model(smollm2_path, tokenizer)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", [MESSAGES, MESSAGES[1:2]], ids=["with-system", "user-only"])
def test_smollm2_template_matches_transformers(smollm2, hf_reference, messages, add_generation_prompt):
    assert smollm2.origin.endswith("tokenizer.chat_template")
    ours = smollm2.render(messages, add_generation_prompt=add_generation_prompt)
    assert ours == hf_reference.render(smollm2.source, messages, add_generation_prompt=add_generation_prompt)
    assert ours.endswith("<|im_start|>assistant\n") == add_generation_prompt


def test_special_tokens_come_from_the_model(smollm2):
    assert (smollm2.bos_token, smollm2.eos_token) == ("<|im_start|>", "<|im_end|>")
    t = ChatTemplate("{{ bos_token }}|{{ eos_token }}", bos_token="<s>", eos_token="</s>")
    assert t.render([]) == "<s>|</s>"
    assert not t.add_bos("<s>|</s>") and t.add_bos("|</s>")   # never a second BOS


def test_hf_environment():
    source = ("{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here: ' + m.content) }}"
              "{% endif %}{% generation %}{{ m.content | tojson }}{% endgeneration %}\n"
              "{% endfor %}{{ tools | tojson }}|{{ strftime_now('%Y') }}|{{ flag }}")
    t = ChatTemplate(source)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    out = t.render([{"role": "user", "content": "é \"q\""}], tools=tools, flag=7)
    # trim_blocks eats the newline after a block tag; tojson keeps non-ASCII text and does not escape HTML.
    assert out == ('"é \\"q\\""[{"type": "function", "function": {"name": "f", "parameters": {}}}]'
                   f"|{datetime.date.today().year}|7")
    with pytest.raises(ChatTemplateError, match="no tools here: x"):
        t.render([{"role": "tool", "content": "x"}])


def test_named_variables_win_over_extra_ones():
    t = ChatTemplate("{{ messages | length }} {{ add_generation_prompt }} {{ extra }}")
    assert t.render([{"role": "user", "content": "a"}], add_generation_prompt=False,
                    messages=[], extra="e") == "1 False e"


def test_tool_call_arguments_reach_the_template_as_objects():
    """OpenAI clients send an assistant call's arguments as a JSON string; templates written for
    Hugging Face read them as an object (Qwen's: `tool_call.arguments | tojson`)."""
    t = ChatTemplate("{% for m in messages %}{% for c in m.tool_calls or [] %}"
                     "{{ c.function.name }}({{ c.function.arguments.city }}){% endfor %}{% endfor %}")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    assert t.render(messages, add_generation_prompt=False) == "get_weather(Oslo)"
    assert call["function"]["arguments"] == '{"city": "Oslo"}'   # the caller's message is not changed


def test_sandbox_and_failures_are_the_requests_fault():
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
    with pytest.raises(ChatTemplateError, match="TypeError"):
        ChatTemplate("{{ messages[0]['content'] + 1 }}").render([{"role": "user", "content": "a"}])
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate("{% for %}")


def test_override_file(tmp_path, smollm2_path, tokenizer):
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}")
    t = ChatTemplate.for_model(smollm2_path, tokenizer, str(f))
    assert t.origin == str(f)
    assert t.render(MESSAGES[1:3]) == "[user] Héllo, what is 2+2?\n[assistant] 4.\n"


def test_model_without_template_falls_back_to_chatml(tmp_path, tokenizer, hf_reference, caplog):
    path = tmp_path / "no_template.gguf"
    w = _ember.GGUFWriter(str(path))
    w.set("general.architecture", "llama")
    w.write_header()
    w.finish()
    with caplog.at_level(logging.WARNING, logger="ember.chat"):
        t = ChatTemplate.for_model(str(path), tokenizer)
    assert t.source == CHATML and "ChatML" in caplog.text and str(path) in caplog.text
    msgs = MESSAGES[:2]
    assert t.render(msgs) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHéllo, what is 2+2?"
                              "<|im_end|>\n<|im_start|>assistant\n")
    assert t.render(msgs) == hf_reference.render(CHATML, msgs, add_generation_prompt=True)


# ---- Llama.create_chat_completion: the same renderer, llama-cpp-python's result shapes ------
@pytest.fixture(scope="module")
def llama(smollm2_path):
    from ember import Llama
    with Llama(smollm2_path, n_ctx=512, n_threads=2, verbose=False) as model:
        yield model


def test_llama_chat_completion(llama, smollm2):
    msgs = MESSAGES[1:2]
    r = llama.create_chat_completion(msgs, temperature=0, max_tokens=10)
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    [choice] = r["choices"]
    prompt = smollm2.render(msgs)
    want = llama.create_completion(llama.tokenize(prompt, add_bos=False, special=True), temperature=0, max_tokens=10)
    assert choice["message"] == {"role": "assistant", "content": want["choices"][0]["text"]}
    assert choice["finish_reason"] == want["choices"][0]["finish_reason"] and r["usage"] == want["usage"]
    assert r["usage"]["prompt_tokens"] == len(llama.tokenize(prompt, add_bos=False, special=True))


def test_llama_chat_completion_stream_and_logprobs(llama):
    msgs = MESSAGES[1:2]
    whole = llama.create_chat_completion(msgs, temperature=0, max_tokens=8, logprobs=True, top_logprobs=2)
    chunks = list(llama.create_chat_completion(msgs, temperature=0, max_tokens=8, stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks) and len({c["id"] for c in chunks}) == 1
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant"} and deltas[-1] == {}
    assert "".join(d.get("content", "") for d in deltas) == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    content = whole["choices"][0]["logprobs"]["content"]
    assert len(content) == whole["usage"]["completion_tokens"]
    for e in content:
        assert 2 <= len(e["top_logprobs"]) <= 3 and max(t["logprob"] for t in e["top_logprobs"]) == e["logprob"]


def test_llama_chat_template_errors_raise(llama):
    # SmolLM2's template concatenates the content: None fails there, as a ValueError subclass.
    with pytest.raises(ChatTemplateError, match="TypeError"):
        llama.create_chat_completion([{"role": "user", "content": None}], max_tokens=1)
