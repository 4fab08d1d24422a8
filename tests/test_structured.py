"""Constrained decoding (issue 40): llguidance grammars as token masks in the engine (LLM) and in
Llama. JSON schemas of the kinds clients send validate with jsonschema every time, on SmolLM2 and
on a tiny random SentencePiece model; GBNF grammars (tests/data/grammars), regexes and choices
hold; the vocabulary llguidance sees is ember's, byte for byte; a grammar survives preemption;
bad schemas and grammars are refused before anything runs."""
import json
import pathlib
import re
import sys

import numpy as np
import pytest

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import hf_tiny  # noqa: E402
from structured_schemas import schemas  # noqa: E402

from ember import LLM, Llama, SamplingParams, _ember  # noqa: E402
from ember.convert import convert  # noqa: E402
from ember.structured import LlamaGrammar, StructuredOutputsParams, llguidance  # noqa: E402

GRAMMARS = pathlib.Path(__file__).resolve().parent / "data" / "grammars"
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def smol(smollm2_path):
    llm = LLM(smollm2_path, n_ctx=512, max_num_seqs=64, n_threads=2, verbose=False)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def tiny_spm_path(tmp_path_factory):
    """A tiny random llama with a SentencePiece vocabulary (byte fallback), converted by ember-convert."""
    d = tmp_path_factory.mktemp("tiny_spm")
    hf_tiny.build("tokenizer-llama", str(d / "hf"), tokenizer="spm")
    path = str(d / "tiny-spm.gguf")
    convert(str(d / "hf"), path, "f32", progress=False)
    return path


def validator(schema):
    return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())


def constrained(**kw):
    return StructuredOutputsParams(**kw)


# ---------------------------------------------------------------------------------- vocabulary

@pytest.mark.parametrize("which", ["smollm2", "tiny_spm"])
def test_llguidance_sees_embers_vocabulary(which, request):
    path = request.getfixturevalue("smollm2_path" if which == "smollm2" else "tiny_spm_path")
    llguidance()
    tok = _ember.Tokenizer.from_gguf_file(path)
    compiler = _ember.GrammarCompiler(tok)
    assert compiler.n_vocab == tok.n_vocab
    for i in range(tok.n_vocab):   # every token: normal, byte, control, user-defined
        piece = tok.token_to_piece(i, True)
        # Byte 0xFF, never in UTF-8 text, is llguidance's special-token marker: that byte token is
        # a nameless special token to it, which no text grammar allows.
        assert compiler.decode([i]) == (b"" if piece == b"\xff" else piece), i


def test_forced_text_is_exact(smol):
    """A regex leaving one text: its UTF-8 comes out exactly (multi-byte characters across tokens)."""
    text = "Grüße aus Köln, 東京 🙂 {\"x\": [1, 2]}"
    out = smol.generate([CHAT.format("Say hi.")], SamplingParams(
        temperature=1.0, seed=1, max_tokens=60, structured_outputs=constrained(regex=re.escape(text))),
        use_tqdm=False)[0].outputs[0]
    assert out.text == text and out.finish_reason == "stop"


# ---------------------------------------------------------------------------------- JSON schemas

def _run_schemas(llm, prompt, all_schemas, max_tokens, **sampling):
    """Every output complete (finish "stop") and valid: the schemas bound every string and array,
    so max_tokens leaves room for the longest (random tokens spell characters byte by byte)."""
    params = [SamplingParams(max_tokens=max_tokens, structured_outputs=constrained(json=s), **sampling)
              for s in all_schemas]
    outs = llm.generate([prompt] * len(all_schemas), params, use_tqdm=False)
    bad = []
    for s, o in zip(all_schemas, outs):
        text = o.outputs[0].text
        try:
            errors = list(validator(s).iter_errors(json.loads(text)))
        except ValueError as e:
            errors = [e]
        if errors or o.outputs[0].finish_reason != "stop":
            bad.append((s, text, o.outputs[0].finish_reason, errors[:1]))
    assert not bad, f"{len(bad)} of {len(all_schemas)} outputs do not validate; first: {bad[0]}"


def test_200_schemas_validate_on_smollm2(smol):
    _run_schemas(smol, CHAT.format("Fill in the JSON record."), schemas(200), 150, temperature=0.0)


def test_200_schemas_validate_on_a_tiny_random_model(tiny_spm_path):
    with LLM(tiny_spm_path, n_ctx=512, max_num_seqs=64, n_threads=2, verbose=False) as llm:
        _run_schemas(llm, "Fill in the JSON record:", schemas(200, seed=41), 400, temperature=1.0, seed=7)


def test_sampling_params_cannot_draw_masked_tokens(smol, rng):
    """Whatever the sampling parameters (high temperature, top_k off, a large logit_bias on a token
    the grammar forbids, penalties), only the grammar's tokens come out."""
    tok = smol.tokenizer
    banned = tok.encode(b"Z", False, False)[0]
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                               "ok": {"type": "boolean"}},
              "required": ["n", "ok"], "additionalProperties": False}
    params = SamplingParams(temperature=float(rng.uniform(1.5, 3.0)), top_k=-1, top_p=1.0, min_p=0.0,
                            presence_penalty=1.5, frequency_penalty=1.0, logit_bias={banned: 100.0},
                            seed=int(rng.integers(1 << 30)), n=4, max_tokens=40,
                            structured_outputs=constrained(json=schema))
    for o in smol.generate([CHAT.format("Give a record.")], params, use_tqdm=False)[0].outputs:
        validator(schema).validate(json.loads(o.text))
        assert o.finish_reason == "stop"


# ---------------------------------------------------------------------------------- other constraints

def test_regex_choice_and_json_object(smol):
    p = [constrained(regex=r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"),
         constrained(choice=["positive", "negative", "neutral ☺"]), constrained(json_object=True)]
    prompts = ["When was the moon landing? Answer briefly.", "Is this review happy: 'I loved it'?",
               "Describe a cat as a JSON object with its name and color."]
    outs = smol.generate([CHAT.format(p) for p in prompts],
                         [SamplingParams(temperature=0.0, max_tokens=48, structured_outputs=s) for s in p],
                         use_tqdm=False)
    assert re.fullmatch(r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]", outs[0].outputs[0].text)
    assert outs[1].outputs[0].text in ("positive", "negative", "neutral ☺")
    assert isinstance(json.loads(outs[2].outputs[0].text), dict)
    assert all(o.outputs[0].finish_reason == "stop" for o in outs)


def test_structural_tag_constrains_after_its_trigger(smollm2_path):
    """vLLM's structural tag (lazy tool calls): free text until the trigger, then the structure's
    begin, its schema's JSON and its end are forced or constrained."""
    llguidance()
    tok = _ember.Tokenizer.from_gguf_file(smollm2_path)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"], "additionalProperties": False}
    tag = {"type": "structural_tag", "triggers": ["<call"],
           "structures": [{"begin": "<call=weather>", "schema": schema, "end": "</call>"}]}
    m = _ember.GrammarCompiler(tok).compile(*constrained(structural_tag=tag).grammar_spec()).matcher()

    def allowed():
        bits = np.unpackbits(m.mask.view(np.uint8), bitorder="little")[:tok.n_vocab]
        return np.flatnonzero(bits).tolist()

    for t in tok.encode(b"Sure, let me look that up. <call", False, False):
        assert len(allowed()) > 1000   # free text: nearly anything goes
        assert m.advance(t), m.error
    forced = []
    while len(allowed()) == 1:
        forced.append(allowed()[0])
        assert m.advance(forced[-1]), m.error
    assert tok.decode(forced, False) == b'=weather>{"city":'
    for i in allowed():   # then the value's opening quote, after the key separator's space
        piece = tok.token_to_piece(i, False)
        assert b' "'.startswith(piece) or piece.startswith(b' "'), piece


def _check_arithmetic(text):
    for line in text.splitlines():
        left, right = line.split(" = ")
        assert re.fullmatch(r"-?[0-9]{1,6}", right)
        assert re.fullmatch(r"[-+*/() 0-9]+", left) and left.count("(") == left.count(")")
        compile(left, "<line>", "eval")


def _check_c(text):
    assert text.endswith("}\n")
    depth = 0
    for line in text.splitlines():
        stripped = line.strip()
        if depth == 0:
            assert re.fullmatch(r"(int|long|double|void) [a-z_][a-z0-9_]{0,15}\(.*\) \{", line), line
        elif stripped != "}":
            assert re.fullmatch(r"(if|while) \(.*\) \{|.*;", stripped), line
        depth += line.count("{") - line.count("}")
    assert depth == 0


GBNF_CHECKS = {
    "json.gbnf": ("Give a JSON object with the keys name and age of a person.",
                  lambda t: isinstance(json.loads(t), dict)),
    "arithmetic.gbnf": ("Write two sums with their results.", _check_arithmetic),
    "list.gbnf": ("List three fruits.", lambda t: re.fullmatch(r"(- [^\n\r\x0b\x0c\x85\u2028\u2029]{1,60}\n){1,5}", t)),
    "c.gbnf": ("Write a C function that adds two numbers.", _check_c),
}


@pytest.mark.parametrize("name", sorted(GBNF_CHECKS))
def test_gbnf_files_constrain(smol, smollm2_path, name):
    """The grammar files, in llama.cpp's GBNF, through LLM and through Llama's LlamaGrammar."""
    prompt, check = GBNF_CHECKS[name]
    text = (GRAMMARS / name).read_text()
    out = smol.generate([CHAT.format(prompt)], SamplingParams(
        temperature=0.0, max_tokens=200, structured_outputs=constrained(grammar=text)), use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop", out.text
    assert check(out.text) is not False, out.text
    with Llama(smollm2_path, n_ctx=512, verbose=False) as llama:
        res = llama(CHAT.format(prompt), grammar=LlamaGrammar.from_file(GRAMMARS / name), max_tokens=200,
                    temperature=0.0)["choices"][0]
    assert res["finish_reason"] == "stop" and check(res["text"]) is not False, res["text"]


LLAMACPP_GBNF_PROMPTS = {name: prompt for name, (prompt, _) in GBNF_CHECKS.items()}
LLAMACPP_GREEDY = pathlib.Path(__file__).resolve().parent / "reference" / "gbnf" / "llamacpp_greedy.json"


@pytest.mark.parametrize("name", sorted(LLAMACPP_GBNF_PROMPTS))
def test_llamacpp_grammar_files_match_as_llamacpp_does(smollm2_path, llamacpp_grammars, name):
    """llama.cpp's own grammar files (grammars/ of the llama-cpp-python sdist) match as llama.cpp
    matches them: every token of llama.cpp's greedy completion under the file
    (tools/gen_gbnf_references.py) is one ember's matcher allows, and where llama.cpp stopped ember's
    may stop. Their rules end in optional whitespace before literal newlines, where a greedy lexer
    would refuse the next line."""
    ref = json.loads(LLAMACPP_GREEDY.read_text(encoding="utf-8"))["completions"][name]
    llguidance()
    tok = _ember.Tokenizer.from_gguf_file(smollm2_path)
    grammar = _ember.GrammarCompiler(tok).compile(*constrained(grammar=(llamacpp_grammars / name).read_text())
                                                  .grammar_spec())
    m = grammar.matcher()
    ids = list(tok.encode(ref["text"].encode(), False, False))
    assert len(ids) > 10
    for i, t in enumerate(ids):
        assert m.mask[t // 32] >> (t % 32) & 1, f"{name}: llama.cpp's token {i} ({tok.decode([t])!r}) is refused"
        assert m.advance(t), m.error
    assert m.accepting == ref["stopped"] or not ref["stopped"]


def test_gbnf_keeps_every_parse_as_llamacpp_does(smollm2_path):
    """GBNF matches character by character with every parse kept: a number's optional trailing
    whitespace may take a newline or leave it to the line, so a second line may follow."""
    llguidance()
    tok = _ember.Tokenizer.from_gguf_file(smollm2_path)
    gbnf = 'root ::= (num "=" ws num "\\n")+\nnum ::= [0-9]+ ws\nws ::= [ \\t\\n]*\n'
    compiler = _ember.GrammarCompiler(tok)
    for text, ok in (("1 = 2\n3 = 4\n", True), ("1\n = 2\n\n", True), ("1 = 2\n\n3", False)):
        m = compiler.compile(*constrained(grammar=gbnf).grammar_spec()).matcher()
        advanced = all(m.advance(t) for t in tok.encode(text.encode(), False, False))
        assert advanced and m.accepting == ok, (text, m.error)


@pytest.mark.parametrize("name", sorted(LLAMACPP_GBNF_PROMPTS))
def test_llamacpp_grammar_files_constrain(smol, llamacpp_grammars, name):
    """Replies under llama.cpp's files: a finished one passes the file's check; one cut off at
    max_tokens is a prefix the grammar still allows (its files have no bound on repetition)."""
    prompt, check = GBNF_CHECKS[name]
    grammar = (llamacpp_grammars / name).read_text()
    for seed in (None, 1, 2):
        params = SamplingParams(temperature=0.0 if seed is None else 0.9, seed=seed, max_tokens=120,
                                structured_outputs=constrained(grammar=grammar))
        out = smol.generate([CHAT.format(prompt)], params, use_tqdm=False)[0].outputs[0]
        assert out.finish_reason in ("stop", "length"), out.text
        if out.finish_reason == "stop" and name == "json.gbnf":
            assert check(out.text) is not False, out.text


# ---------------------------------------------------------------------------------- Llama

def test_llama_grammar_and_response_format(smollm2_path):
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 20},
                                               "pages": {"type": "integer", "minimum": 1, "maximum": 2000}},
              "required": ["title", "pages"], "additionalProperties": False}
    with Llama(smollm2_path, n_ctx=512, verbose=False) as llama:
        msgs = [{"role": "user", "content": "Describe a book."}]
        for fmt in ({"type": "json_object", "schema": schema},
                    {"type": "json_schema", "json_schema": {"name": "book", "schema": schema, "strict": True}}):
            r = llama.create_chat_completion(msgs, response_format=fmt, max_tokens=80, temperature=0.0)
            validator(schema).validate(json.loads(r["choices"][0]["message"]["content"]))
        r = llama.create_chat_completion(msgs, response_format={"type": "json_object"}, max_tokens=120, temperature=0.0)
        assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)
        g = LlamaGrammar.from_json_schema(json.dumps(schema))
        chunks = list(llama("A book:", grammar=g, max_tokens=80, temperature=0.7, seed=3, stream=True))
        validator(schema).validate(json.loads("".join(c["choices"][0]["text"] for c in chunks)))
        with pytest.raises(ValueError, match="not both"):
            llama.create_chat_completion(msgs, response_format={"type": "json_object"}, grammar=g)
        with pytest.raises(TypeError, match="LlamaGrammar"):
            llama("x", grammar='root ::= "a"')


# ---------------------------------------------------------------------------------- preemption, cache

@pytest.mark.parametrize("kv_host_mb", [0, 64], ids=["recompute", "swap"])
def test_grammar_survives_preemption(smollm2_path, kv_host_mb):
    """Constrained sequences preempted mid-grammar (recomputed, or swapped out to the host tier and
    back) give the tokens they give with room to spare."""
    llguidance()
    model = _ember.Model(smollm2_path, _ember.ModelParams())
    tok = model.tokenizer
    schema = {"type": "object", "properties": {"story": {"type": "string", "maxLength": 120},
                                               "n": {"type": "array", "items": {"type": "integer"},
                                                     "maxItems": 6}},
              "required": ["story", "n"], "additionalProperties": False}
    kind, grammar = constrained(json=schema).grammar_spec()
    prompts = [list(tok.encode(CHAT.format(f"Tell story {i} as JSON.").encode(), False, True)) for i in range(8)]

    def run(engine):
        ids = [engine.add_request(p, temperature=0.0, max_tokens=70, grammar_kind=kind, grammar=grammar)
               for p in prompts]
        got, done = {i: [] for i in ids}, set()
        while len(done) < len(ids):
            for o in engine.poll(0.1):
                got[o.request_id] += o.token_ids
                assert o.finish_reason != "error", o.error
                if o.finished:
                    done.add(o.request_id)
        return [got[i] for i in ids]

    small = _ember.Engine(model, n_ctx=256, max_num_seqs=8, max_num_batched_tokens=64, n_threads=2,
                          kv_blocks=18, kv_host_mb=kv_host_mb, deterministic=True)
    squeezed = run(small)
    stats = small.stats()
    assert stats["preemptions"] > 0 and (stats["swaps_out"] > 0) == (kv_host_mb > 0), stats
    small.close()
    roomy = _ember.Engine(model, n_ctx=256, max_num_seqs=8, n_threads=2, deterministic=True)
    assert run(roomy) == squeezed
    roomy.close()


def test_greedy_reads_the_mask_in_place_as_the_masked_row_does(smollm2_path):
    """A greedy constrained step takes the best allowed logit in place; asking for logprobs takes the
    other path (the row copied, masked with -inf, then sampled): both give the same tokens."""
    llguidance()
    model = _ember.Model(smollm2_path, _ember.ModelParams())
    tok = model.tokenizer
    kind, grammar = constrained(json=schemas(3, seed=11)[2]).grammar_spec()
    prompts = [list(tok.encode(CHAT.format(f"Describe item {i} as JSON.").encode(), False, True)) for i in range(4)]
    engine = _ember.Engine(model, n_ctx=256, max_num_seqs=8, n_threads=2, deterministic=True)
    runs = []
    for logprobs in (-1, 0):
        ids = [engine.add_request(p, temperature=0.0, max_tokens=40, grammar_kind=kind, grammar=grammar,
                                  logprobs=logprobs) for p in prompts]
        got, done = {i: [] for i in ids}, set()
        while len(done) < len(ids):
            for o in engine.poll(0.1):
                got[o.request_id] += o.token_ids
                assert o.finish_reason != "error", o.error
                if o.finished:
                    done.add(o.request_id)
        runs.append([got[i] for i in ids])
    engine.close()
    assert runs[0] == runs[1] and all(runs[0])


def test_compiled_grammars_are_cached(smollm2_path):
    llguidance()
    tok = _ember.Tokenizer.from_gguf_file(smollm2_path)
    compiler = _ember.GrammarCompiler(tok)
    kind, text = constrained(json=schemas(1, seed=5)[0]).grammar_spec()
    first = compiler.compile(kind, text)
    assert compiler.compile(kind, text) is first and compiler.n_cached == 1
    m = first.matcher()
    assert m.mask.dtype.name == "uint32" and m.mask.shape == ((tok.n_vocab + 31) // 32,)
    assert not m.stopped and not m.accepting
    assert not m.advance(tok.encode(b"Z", False, False)[0]) and "not allowed" in m.error


# ---------------------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("kw, match", [
    (dict(json={"type": "objekt"}), r"structured_outputs\.json: .*objekt"),
    (dict(json='{"type": "object",'), r"structured_outputs\.json: the schema is not valid JSON"),
    (dict(json={"type": "object", "properties": {"a": {"type": "string", "pattern": "(["}}}),
     r"structured_outputs\.json: .*unclosed"),
    (dict(regex="a(b"), r"structured_outputs\.regex: .*unclosed group"),
    (dict(grammar='root ::= item\n'), r"structured_outputs\.grammar: .*item"),
    (dict(grammar="start: foo"), r"structured_outputs\.grammar: .*foo"),
    (dict(choice="abc"), "choice must be a non-empty list of strings"),
    (dict(json={"type": "object"}, regex="a"), "exactly one of"),
    (dict(), "exactly one of"),
    (dict(structural_tag={"structures": [{"begin": "<f>", "schema": {}, "end": "</f>"}], "triggers": ["<g"]}),
     "starts with none of the triggers"),
])
def test_bad_specs_are_refused_before_anything_runs(smol, kw, match):
    before = smol.stats()["prompt_tokens"]
    with pytest.raises(ValueError, match="(?s)" + match):
        smol.generate(["x"], SamplingParams(structured_outputs=constrained(**kw)), use_tqdm=False)
    assert smol.stats()["prompt_tokens"] == before


def test_bad_engine_grammar_and_kind(smollm2_path):
    llguidance()
    model = _ember.Model(smollm2_path, _ember.ModelParams())
    engine = _ember.Engine(model, n_ctx=128, n_threads=2)
    with pytest.raises(ValueError, match="invalid lark"):
        engine.add_request([1, 2], grammar_kind="lark", grammar="start: nothing_here")
    with pytest.raises(ValueError, match="grammar kind must be"):
        engine.add_request([1, 2], grammar_kind="yaml", grammar="a: 1")
    with pytest.raises(ValueError, match="structured_outputs.grammar"):
        LlamaGrammar.from_string("root ::= (\"a\"")
    engine.close()
