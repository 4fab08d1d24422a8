"""Reasoning replies (ember.chat.reasoning): the thinking split out as reasoning_content, whole and
streamed in random pieces, for each parser's tags; ember-server's chat responses built from such
replies; and the grammars of ember.chat.constrain (thinking, then the constrained answer; the thinking
budget; tool calls forced or lazy) run token by token through llguidance on a real BPE vocabulary,
sampling at random among the tokens each mask allows."""
import json
import pathlib
import random

import jsonschema
import pytest
from llguidance import LLMatcher, LLTokenizer

from ember.chat import constrain
from ember.chat.reasoning import CHOICES, ReasoningParser
from ember.outputs import CompletionOutput, RequestOutput

QWEN3 = ReasoningParser("qwen3")
OPENED = "<|im_start|>assistant\n<think>\n"   # a template that opens the thought in the prompt
CASES = [   # parser, prompt, reply, (content, reasoning)
    ("qwen3", "", "<think>\nFirst 2 < 3, so.\n</think>\n\nThe answer is <b>4</b>.",
     ("The answer is <b>4</b>.", "First 2 < 3, so.")),
    ("qwen3", "", "The answer is 4.", ("The answer is 4.", "")),
    ("qwen3", "", "<think>\nStill thinking when cut off  ", ("", "Still thinking when cut off")),
    ("qwen3", OPENED, "It is 4.\n</think>\n\n4", ("4", "It is 4.")),
    ("qwen3", OPENED, "<think>opened twice</think>ok", ("ok", "opened twice")),
    ("qwen3", "", "<thin", ("<thin", "")),
    ("qwen3", "", "a </think> b", ("a </think> b", "")),
    ("deepseek_r1", "", "No tag here\n</think>\nDone", ("Done", "No tag here")),
    ("deepseek_r1", "", "<think>\nTagged</think>Done", ("Done", "Tagged")),
    ("mistral", "", "[THINK]hmm, [b] [/THINK]Yes", ("Yes", "hmm, [b]")),
    ("seed_oss", "", "<seed:think>x < y</seed:think>\nz", ("z", "x < y")),
    ("granite", "", "Here is my thought process:\nIt is 4.\nHere is my response:\nFour.", ("Four.", "It is 4.")),
    ("granite", "", "Four, without a thought.", ("Four, without a thought.", "")),
    ("gpt_oss", "", "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi",
     ("Hi", "Think.")),
    ("none", "", "<think>kept</think>", ("<think>kept</think>", "")),
]


def _pieces(text, rng):
    if len(text) < 2:
        return [text]
    cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


@pytest.mark.parametrize("name,prompt,text,expected", CASES)
def test_split_whole_and_streamed(name, prompt, text, expected):
    parser = ReasoningParser(name)
    assert parser.split(text, prompt) == expected
    rng = random.Random()
    for _ in range(30):
        splitter = parser.splitter(prompt)
        if splitter is None:
            continue
        got = ["", ""]
        for piece in _pieces(text, rng):
            c, r = splitter.feed(piece)
            got = [got[0] + c, got[1] + r]
        c, r = splitter.finish()
        assert (got[0] + c, got[1] + r) == expected


def test_one_character_at_a_time_holds_back_only_a_possible_tag():
    splitter = QWEN3.splitter("")
    shown = [splitter.feed(ch) for ch in "<think>a <b> c</think>d"]
    # "<" of "<b>" is held until "b" shows it is no tag, a space until text follows it.
    assert [r for _, r in shown if r] == ["a", " <b", ">", " c"]
    assert "".join(c for c, _ in shown) == "d" and splitter.finish() == ("", "")


def test_parsers_from_templates_and_names():
    assert ReasoningParser.for_template("{{ '<|im_start|>assistant\\n<think>\\n' }}").name == "qwen3"
    assert ReasoningParser.for_template("{{ '<|start|>assistant<|channel|>final<|message|>' }}").name == "gpt_oss"
    assert ReasoningParser.for_template("[THINK]{{ x }}[/THINK]").name == "mistral"
    assert ReasoningParser.for_template("<|im_start|>{{ m }}").name == "none"
    assert ReasoningParser.for_template("<think>", "none").name == "none"
    assert ReasoningParser.for_template("", "deepseek").name == "none"   # llama.cpp's: as the template says
    assert ReasoningParser("deepseek-r1").name == "deepseek_r1" and ReasoningParser("gpt-oss").keeps_special
    assert not QWEN3.keeps_special and ReasoningParser("mistral").keeps_special
    assert QWEN3.starts_in_thought(OPENED) and not QWEN3.starts_in_thought("<think>x</think>\n")
    with pytest.raises(ValueError, match="reasoning parser 'think' is not one of"):
        ReasoningParser("think")
    with pytest.raises(ValueError, match="for_template"):
        ReasoningParser("auto")
    assert "deepseek_r1" in CHOICES and "qwen3" in CHOICES


# ---- ember-server's chat responses -----------------------------------------------------------

def _builder(body, parser=QWEN3, tools=None, prompt=""):
    from ember.server.openai_schema import parse_chat
    from ember.server.responses import ResponseBuilder
    req = parse_chat(dict({"messages": [{"role": "user", "content": "2+2?"}]}, **body), 1000)
    return ResponseBuilder(req, "m", None, [prompt], True, tools, parser)


def _out(text, finish):
    return RequestOutput("r", None, [1, 2], None, [CompletionOutput(0, text, [5] * 3, None, None, finish)],
                         finish is not None)


REPLY = "<think>\nA call is needed: <tool_call> tags.\n</think>\n\nLet me check.\n<tool_call>\n" \
        '{"name": "get", "arguments": {"x": 1}}\n</tool_call>'
TOOL = {"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}


def test_server_reply_splits_reasoning_then_reads_calls_from_the_content():
    from ember.chat import ToolCallParser
    message = _builder({"tools": [TOOL]}, tools=ToolCallParser("hermes")).response([_out(REPLY, "stop")])
    choice = message["choices"][0]
    assert choice["message"]["reasoning_content"] == "A call is needed: <tool_call> tags."
    assert choice["message"]["content"] == "Let me check.\n"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get"]
    assert choice["finish_reason"] == "tool_calls"


def test_server_stream_gives_deltas_of_each():
    from ember.chat import ToolCallParser
    b, rng = _builder({"tools": [TOOL]}, tools=ToolCallParser("hermes")), random.Random()
    cuts = sorted(rng.sample(range(1, len(REPLY)), 20)) + [len(REPLY)]
    chunks = [c["choices"][0] for k, n in enumerate(cuts)
              for c in b.chunks(0, _out(REPLY[:n], "stop" if k == len(cuts) - 1 else None))]
    deltas = [c["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "A call is needed: <tool_call> tags."
    assert "".join(d.get("content") or "" for d in deltas) == "Let me check.\n"
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c["function"]["name"] for c in calls] == ["get"]
    assert chunks[-1]["finish_reason"] == "tool_calls"


def test_server_reply_to_an_opened_thought():
    b = _builder({}, prompt=OPENED)
    message = b.response([_out("Two and two.\n</think>\n\nFour.", "stop")])["choices"][0]["message"]
    assert (message["content"], message["reasoning_content"]) == ("Four.", "Two and two.")


# ---- the grammars, token by token ------------------------------------------------------------

BPE = pathlib.Path(__file__).parent / "reference" / "hf" / "tokenizers" / "bpe" / "tokenizer.json"


@pytest.fixture(scope="module")
def vocab():
    return LLTokenizer(BPE.read_text(encoding="utf-8"))


def sample(vocab, grammar, rng, prefer=(), max_tokens=300, opening=""):
    """A reply drawn at random under the grammar (tokens in prefer drawn half the time, to steer it
    into tags), after `opening`'s tokens: its text and its tokens' texts."""
    m = LLMatcher(vocab, grammar, log_level=1)
    assert not m.is_error(), m.get_error()
    pieces, tokens = [], []
    for t in vocab.tokenize_str(opening) if opening else []:
        assert m.consume_token(t), m.get_error()
        pieces.append(vocab.decode_str([t]))
        tokens.append(t)
    for _ in range(max_tokens):
        mask = m.compute_logit_bias()
        allowed = [t for t in range(vocab.vocab_size) if mask[t]]
        assert allowed, "the grammar allows nothing"
        if vocab.eos_token in allowed and (len(allowed) == 1 or rng.random() < 0.3):
            break
        choices = [t for t in allowed if t != vocab.eos_token]
        liked = [t for t in choices if vocab.decode_str([t]) in prefer]
        t = rng.choice(liked if liked and rng.random() < 0.5 else choices)
        assert m.consume_token(t), m.get_error()
        pieces.append(vocab.decode_str([t]))
        tokens.append(t)
        if m.is_stopped():
            break
    return vocab.decode_bytes(tokens).decode("utf-8", errors="replace"), pieces


TAGS = ("<", "/", "t", "h", "in", "k", ">", "think")
SCHEMAS = [
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["n"],
     "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1,
                                               "maxItems": 3}}, "required": ["tags"], "additionalProperties": False},
    {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "boolean"}]},
]


@pytest.mark.parametrize("prompt", [OPENED, ""], ids=["opened", "may_open"])
@pytest.mark.parametrize("budget", [None, 0, 5])
def test_the_answer_is_constrained_after_the_thought(vocab, prompt, budget):
    rng = random.Random()
    for schema in SCHEMAS:
        grammar = constrain.grammar(constrain.json_answer(schema), constrain.Thought(QWEN3, prompt), budget)
        for _ in range(3):
            text, pieces = sample(vocab, grammar, rng, TAGS)
            content, thought = QWEN3.split(text, prompt)
            if budget is None and "<think>" in text[:20] + prompt and "</think>" not in text:
                continue   # an unbounded thought, cut off by max_tokens before it closed
            jsonschema.validate(json.loads(content), schema)
            if "</think>" in text and budget is not None:
                opened = 0 if QWEN3.starts_in_thought(prompt) else _tokens_to(pieces, "<think>")
                assert _tokens_to(pieces, "</think>") - opened <= budget + len("</think>"), text


def _tokens_to(pieces, tag):
    """How many tokens it takes until text holds tag."""
    text = ""
    for n, p in enumerate(pieces, 1):
        text += p
        if tag in text:
            return n
    return len(pieces)


@pytest.mark.parametrize("budget", [0, 1, 7])
def test_the_budget_closes_the_thought_at_its_count(vocab, budget):
    """Never steered to the closing tag, a thought runs to its budget exactly, then is closed."""
    rng = random.Random()
    grammar = constrain.grammar(None, constrain.Thought(QWEN3, OPENED), budget)
    for _ in range(5):
        m = LLMatcher(vocab, grammar, log_level=1)
        for _ in range(budget):
            mask = m.compute_logit_bias()
            allowed = [t for t in range(vocab.vocab_size) if mask[t] and "<" not in vocab.decode_str([t])
                       and t != vocab.eos_token]
            assert m.consume_token(rng.choice(allowed))
        forced = m.compute_ff_tokens()
        assert vocab.decode_str(forced).startswith("</think>")
    assert constrain.grammar(None, constrain.Thought(QWEN3, OPENED), None) is None   # no budget: free


def test_free_text_may_not_open_a_thought_past_the_budget(vocab):
    """Where the reply may open a thought, free text cannot start with one: the budget's branch is
    the only way to think."""
    grammar = constrain.grammar(None, constrain.Thought(QWEN3, ""), 2)
    rng = random.Random()
    for _ in range(10):
        text, pieces = sample(vocab, grammar, rng, TAGS)
        content, thought = QWEN3.split(text)
        if text.lstrip().startswith("<think>"):
            assert "</think>" in text and _tokens_to(pieces, "</think>") - _tokens_to(pieces, "<think>") <= 2 + 8


TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {
            "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}},
         {"type": "function", "function": {"name": "put", "parameters": {
            "type": "object", "properties": {"y": {"enum": ["a", "b"]}}, "required": ["y"],
            "additionalProperties": False}}}]


@pytest.mark.parametrize("style", ["hermes", "json"])
@pytest.mark.parametrize("parallel", [False, True])
def test_required_tool_calls_are_always_valid_calls(vocab, style, parallel):
    from ember.chat import ToolCallParser
    parser, rng = ToolCallParser(style), random.Random()
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for prompt, reasoning in (("", ReasoningParser("none")), (OPENED, QWEN3)):
        grammar = constrain.grammar(constrain.tool_answer(style, TOOLS, parallel, lazy=False),
                                    constrain.Thought(reasoning, prompt), 4 if reasoning.active else None)
        for _ in range(4):
            text, _ = sample(vocab, grammar, rng, ("{", "}", '"', "0", "a"), max_tokens=5000)
            content, _ = reasoning.split(text, prompt)
            calls = parser.parse(content)[1]
            assert calls and (parallel or len(calls) == 1), text
            for call in calls:
                jsonschema.validate(json.loads(call["function"]["arguments"]), by_name[call["function"]["name"]])


def _whole_text(vocab, t) -> bool:
    """Whether token t is whole UTF-8 text (not part of a character the next token would finish)."""
    try:
        vocab.decode_bytes([t]).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_lazy_tool_calls_leave_free_text_free_until_a_call_opens(vocab):
    grammar = constrain.grammar(constrain.tool_answer("hermes", TOOLS, True, lazy=True),
                                constrain.Thought(ReasoningParser("none"), ""))
    m = LLMatcher(vocab, grammar, log_level=1)
    free = LLMatcher(vocab, "start: /(?s:.*)/", log_level=1)
    rng = random.Random()
    for _ in range(20):   # any text at all, as if nothing constrained it
        mask = m.compute_logit_bias()
        assert mask == free.compute_logit_bias()
        t = rng.choice([t for t in range(vocab.vocab_size) if mask[t] and t != vocab.eos_token
                        and _whole_text(vocab, t) and "<" not in vocab.decode_str([t])])
        assert m.consume_token(t) and free.consume_token(t)
    for t in vocab.tokenize_str(" <tool_call>"):
        assert m.consume_token(t)
    assert vocab.decode_str(m.compute_ff_tokens()).startswith('\n{"name": "')   # a call is forced from here


def test_lazy_json_calls_are_calls_once_a_reply_opens_with_a_brace(vocab):
    """Llama 3-style tool calls (a bare JSON object): a reply that opens with "{" is a valid call,
    after a thought too; any other reply is free text."""
    from ember.chat import ToolCallParser
    parser, rng = ToolCallParser("json"), random.Random()
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for prompt, reasoning in (("", ReasoningParser("none")), (OPENED, QWEN3)):
        grammar = constrain.grammar(constrain.tool_answer("json", TOOLS, True, lazy=True),
                                    constrain.Thought(reasoning, prompt), 4 if reasoning.active else None)
        opening = "</think>" if reasoning.active else ""
        for k in range(8):
            text, _ = sample(vocab, grammar, rng, ("{", "}", '"', "0", "a"), max_tokens=3000,
                             opening=opening + ("{" if k % 2 else ""))
            content, _ = reasoning.split(text, prompt)
            calls = parser.parse(content)[1]
            assert bool(calls) == content.lstrip().startswith("{"), text
            for call in calls:
                jsonschema.validate(json.loads(call["function"]["arguments"]), by_name[call["function"]["name"]])


def test_other_answers(vocab):
    rng = random.Random()
    none = constrain.Thought(ReasoningParser("none"), "")
    for _ in range(5):
        assert sample(vocab, constrain.grammar(constrain.choice_answer(["yes", "no/maybe"]), none), rng)[0] in \
            ("yes", "no/maybe")
        text = sample(vocab, constrain.grammar(constrain.regex_answer(r"[0-9]{2}/[a-c]"), none), rng)[0]
        assert len(text) == 4 and text[2] == "/"
        text = sample(vocab, constrain.grammar(constrain.grammar_answer('root ::= "a" [0-9]+ "b"'),
                                               constrain.Thought(QWEN3, OPENED), 2), rng)[0]
        content, thought = QWEN3.split(text, OPENED)
        assert content[0] == "a" and content[-1] == "b" and content[1:-1].isdigit()
    with pytest.raises(ValueError, match="does not parse"):
        constrain.grammar_answer("root ::= (")


HARMONY_MARKERS = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|return|>", "<|constrain|>", "<|call|>")


@pytest.fixture(scope="module")
def harmony_vocab():
    """The BPE vocabulary with gpt-oss's markers as special tokens."""
    spec = json.loads(BPE.read_text(encoding="utf-8"))
    n = max(max(spec["model"]["vocab"].values()), max(t["id"] for t in spec["added_tokens"])) + 1
    spec["added_tokens"] += [{"id": n + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for i, name in enumerate(HARMONY_MARKERS)]
    return LLTokenizer(json.dumps(spec))


@pytest.mark.parametrize("budget", [None, 0, 4])
def test_harmony_answer_in_the_final_channel_after_a_bounded_analysis(harmony_vocab, budget):
    harmony, rng = ReasoningParser("gpt_oss"), random.Random()
    schema = SCHEMAS[0]
    grammar = constrain.grammar(constrain.json_answer(schema), constrain.Thought(harmony, "<|start|>assistant"),
                                budget)
    for _ in range(6):
        m = LLMatcher(harmony_vocab, grammar, log_level=1)
        tokens = []
        for _ in range(200):
            mask = m.compute_logit_bias()
            allowed = [t for t in range(harmony_vocab.vocab_size) if mask[t]]
            if harmony_vocab.eos_token in allowed and rng.random() < 0.5:
                break
            t = rng.choice([t for t in allowed if t != harmony_vocab.eos_token])
            assert m.consume_token(t), m.get_error()
            tokens.append(t)
            if m.is_stopped():
                break
        else:
            continue   # 200 tokens and no end: a walk cut off (in the analysis, or inside the answer)
        pieces = [harmony_vocab.dbg_tokens([t])[1:-1] if harmony_vocab.is_special_token(t) else
                  harmony_vocab.decode_bytes([t]).decode("utf-8", errors="replace") for t in tokens]
        text = "".join(pieces)
        if budget is None and "<|channel|>final<|message|>" not in text:
            continue   # an unbounded analysis, cut off
        content, thought = harmony.split(text)
        jsonschema.validate(json.loads(content), schema)
        if budget is not None and "<|end|>" in pieces:
            assert pieces.index("<|end|>") - pieces.index("<|message|>") - 1 <= budget


# ---- tags that are special tokens of the model's vocabulary ---------------------------------

TAG_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


@pytest.fixture(scope="module")
def tagged_tokenizer(smollm2_path):
    """SmolLM2's vocabulary with Qwen3's tags added as user-defined tokens (GGUF token type 4), as a
    converted Qwen3 has them: special to a grammar, text to the detokenizer."""
    from gguf import GGUFReader

    from ember import _ember
    r = GGUFReader(smollm2_path)

    def strings(key):
        f = r.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    def scalar(key):
        f = r.fields[key]
        return f.parts[f.data[0]][0].item()
    types = r.fields["tokenizer.ggml.token_type"]
    tokens = strings("tokenizer.ggml.tokens") + list(TAG_TOKENS)
    token_types = [int(types.parts[i][0]) for i in types.data] + [4] * len(TAG_TOKENS)
    return _ember.Tokenizer.from_vocab("gpt2", tokens, token_types=token_types,
                                       merges=strings("tokenizer.ggml.merges"),
                                       pre=bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode(),
                                       bos=scalar("tokenizer.ggml.bos_token_id"),
                                       eos=scalar("tokenizer.ggml.eos_token_id"), add_bos=False)


def _allowed(matcher, n_vocab):
    mask = matcher.mask
    return [t for t in range(n_vocab) if mask[t // 32] >> (t % 32) & 1]


def test_tags_that_are_special_tokens_are_named_by_id(tagged_tokenizer):
    from ember import _ember
    from ember.structured import StructuredOutputsParams
    tok = tagged_tokenizer
    spell = constrain.spelling(tok)
    close = tok.n_vocab - 3
    assert spell("</think>") == f"<[{close}]>" and spell("plain") == '"plain"'
    text = constrain.grammar(constrain.json_answer(SCHEMAS[0]), constrain.Thought(QWEN3, OPENED, spell), 3)
    kind, grammar = StructuredOutputsParams(grammar=text).grammar_spec()
    matcher = _ember.GrammarCompiler(tok).compile(kind, grammar).matcher()
    assert close in _allowed(matcher, tok.n_vocab)   # the model may close its thought itself, with its token
    word = tok.encode(b"Hmm", False, False)[0]
    for _ in range(3):
        assert matcher.advance(word)
    assert _allowed(matcher, tok.n_vocab) == [close]   # the budget is spent: only the closing token
    assert matcher.advance(close)
    assert close not in _allowed(matcher, tok.n_vocab)


def test_lazy_calls_open_on_a_special_token(tagged_tokenizer):
    from ember import _ember
    from ember.structured import StructuredOutputsParams
    tok = tagged_tokenizer
    opening = tok.n_vocab - 2   # <tool_call>
    text = constrain.grammar(constrain.tool_answer("hermes", TOOLS, True, lazy=True, spell=constrain.spelling(tok)),
                             constrain.Thought(QWEN3, "<think>\n\n</think>\n\n", constrain.spelling(tok)))
    kind, grammar = StructuredOutputsParams(grammar=text).grammar_spec()
    matcher = _ember.GrammarCompiler(tok).compile(kind, grammar).matcher()
    for t in tok.encode(b"Let me look.", False, False):
        assert matcher.advance(t)
    assert opening in _allowed(matcher, tok.n_vocab)
    assert matcher.advance(opening)
    allowed = _allowed(matcher, tok.n_vocab)
    assert allowed == tok.encode(b"\n", False, False)[:1]   # the call's layout is forced from its opening on


@pytest.mark.parametrize("parser,prompt,text,thinking", [
    ("qwen3", "", "<think>\nFirst 2 < 3.\n</think>\n\nFour.", "<think>\nFirst 2 < 3.\n</think>"),
    ("qwen3", OPENED, "It is 4.</think>Four.", "It is 4.</think>"),
    ("qwen3", "", "Four, without a thought.", ""),
    ("qwen3", "", "<think>\nCut off while thinking", "<think>\nCut off while thinking"),
    ("deepseek_r1", "", "No tag here\n</think>\nDone", "No tag here\n</think>"),
    ("none", "", "<think>kept</think>", ""),
])
def test_thinking_tokens_end_with_the_closing_tag(tagged_tokenizer, parser, prompt, text, thinking):
    """usage's reasoning_tokens: the reply's tokens through the one that closes its thought."""
    tok = tagged_tokenizer
    ids = tok.encode(text.encode(), False, True)
    expected = len(tok.encode(thinking.encode(), False, True)) if thinking else 0
    assert ReasoningParser(parser).thinking_tokens(prompt, ids, tok) == expected
