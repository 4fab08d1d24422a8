"""The option table (ember/options.py): its defaults against the C++ params structs, every CLI's
parser and the Python front ends taking it alike, bad values named, and docs/options.md current."""
import argparse
import inspect
import pathlib

import numpy as np
import pytest

from ember import LLM, Llama, _ember, bench, cli, options, options_doc, perplexity, quantize
from ember.server import args as server_args

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "options.md"
STRUCTS = {"ModelParams": (options.LLAMA, options.LLM), "ContextParams": (options.LLAMA,),
           "EngineParams": (options.LLM,)}
# Each CLI's parser, and the arguments it needs.
PARSERS = {options.EMBER: (cli._parser, ["-m", "x.gguf", "-p", "hi"]),
           options.BENCH: (bench.parser, ["-m", "x.gguf"]),
           options.PERPLEXITY: (perplexity.parser, ["-m", "x.gguf", "-f", "t.txt"]),
           options.SERVER: (server_args.parser, ["-m", "x.gguf"]),
           options.QUANTIZE: (quantize.parser, ["in.gguf", "out.gguf", "Q4_K"])}


def _struct_value(value, option):
    if value is None:   # None: all cores, which the structs spell 0; a list option: empty
        return [] if option.repeat else 0
    return value


def test_table_defaults_are_the_structs():
    seen = set()
    for (struct, field), value in options.struct_defaults(getattr(_ember, s) for s in STRUCTS).items():
        for option in options.OPTIONS.values():
            if struct in option.fields and (option.field or option.name) == field:
                for front_end in STRUCTS[struct]:
                    assert _struct_value(option.default_for(front_end), option) == value, (struct, field, front_end)
                    seen.add(option.name)
    assert {"n_ctx", "n_batch", "kv_block_size", "max_num_seqs", "kv_gpu_cache_mb", "type_k", "embedding",
            "enable_prefix_caching", "use_mmap"} <= seen


def test_every_field_an_option_sets_is_bound():
    for option in options.OPTIONS.values():
        for struct in option.fields:
            assert hasattr(getattr(_ember, struct)(), option.field or option.name), (option.name, struct)


def test_front_ends_name_declared_options_and_no_flag_twice():
    for front_end, names in options.FRONT_ENDS.items():
        assert len(set(names)) == len(names), front_end
        flags = [f for n in names for f in options.OPTIONS[n].flags + options.OPTIONS[n].negative]
        assert len(set(flags)) == len(flags), front_end
    for option in options.OPTIONS.values():
        assert set(option.defaults) <= set(options.FRONT_ENDS), option.name
        assert option.negative == () or option.type is options._boolean, option.name
        unset_somewhere = option.default is None or None in option.defaults.values()
        assert option.required or not unset_somewhere or option.unset, f"{option.name}: say what unset means"


@pytest.mark.parametrize("front_end", options.CLIS)
def test_cli_defaults_are_the_table(front_end):
    make, needed = PARSERS[front_end]
    args = make().parse_args(needed)
    for name in options.FRONT_ENDS[front_end]:
        if options.OPTIONS[name].flags and not options.OPTIONS[name].env:
            assert getattr(args, name) == ("x.gguf" if name == "model" else options.default(name, front_end)), name


def _draw(option, rng):
    """A valid value of the option other than its default, and how a command line spells it."""
    if option.choices:
        value = str(rng.choice([c for c in option.choices if c != option.default]))
        return value, value
    if option.type is options._boolean:
        return (not option.default), str(int(not option.default))
    if option.type is options.tensor_overrides:
        value = rf"blk\.{rng.integers(100)}\.=CPU"
        return [value], value
    if option.type is options._integer:
        value = int(rng.integers(1, 5000)) + 2
        return value, str(value)
    if option.type is options._number and option.maximum is not None:
        value = float(rng.uniform(option.minimum or 0.0, option.maximum))
        return value, repr(value)
    if option.type is options._number:
        value = float(rng.integers(1, 1 << 20)) / 4
        return value, str(value)
    value = f"text-{rng.integers(1 << 30)}"
    return value, value


@pytest.mark.parametrize("front_end", options.CLIS)
def test_cli_takes_every_flag_of_its_options(front_end):
    rng = np.random.default_rng()
    make, needed = PARSERS[front_end]
    for name in options.FRONT_ENDS[front_end]:
        option = options.OPTIONS[name]
        for flag in option.flags:
            value, text = _draw(option, rng)
            args = make().parse_args([*needed, flag, text])
            assert getattr(args, name) == value, (flag, text)
        for flag in option.negative:
            assert getattr(make().parse_args([*needed, flag]), name) is False, flag
        if option.type is options._boolean and option.flags:
            assert getattr(make().parse_args([*needed, option.flags[0]]), name) is True


def test_shared_flags_are_shared():
    """-ngl, -t and the KV cache flags: every tool, one spelling, one default."""
    for flag, name in (("-ngl", "n_gpu_layers"), ("-t", "n_threads"), ("-ctk", "type_k"), ("-ctv", "type_v"),
                       ("-nkvo", "offload_kqv"), ("--kv-gpu-cache-mb", "kv_gpu_cache_mb")):
        got = set()
        for front_end, (make, needed) in PARSERS.items():
            parser = make()
            if front_end == options.QUANTIZE and name != "n_threads":
                continue   # it loads no model: only -t
            assert flag in parser._option_string_actions, (front_end, flag)
            got.add(getattr(parser.parse_args(needed), name))
        assert len(got) == 1, (flag, got)


BAD_FLAGS = [("n_threads", ["-t", "-3"], "-t/--threads"), ("n_threads", ["--threads", "many"], "-t/--threads"),
             ("n_gpu_layers", ["-ngl", "-2"], "-ngl/--gpu-layers/--n-gpu-layers"),
             ("type_k", ["-ctk", "q6_k"], "-ctk/--cache-type-k"),
             ("kv_gpu_cache_mb", ["--kv-gpu-cache-mb", "-1"], "--kv-gpu-cache-mb"),
             ("kv_gpu_cache_mb", ["--kv-gpu-cache-mb", "1.5"], "--kv-gpu-cache-mb"),
             ("use_mmap", ["-mmp", "2"], "-mmp/--mmap")]


@pytest.mark.parametrize("front_end,argv,named", [(f, argv, named) for f in options.CLIS
                                                  for name, argv, named in BAD_FLAGS if name in options.FRONT_ENDS[f]])
def test_cli_bad_values_name_the_flag(front_end, argv, named, capsys):
    make, needed = PARSERS[front_end]
    with pytest.raises(SystemExit):
        make().parse_args([*needed, *argv])
    err = capsys.readouterr().err
    assert named in err and argv[1] in err, err


@pytest.mark.parametrize("argv,named", [
    (["--kv-mb", "-1"], "--kv-mb"), (["--kv-host-mb", "-5"], "--kv-host-mb"), (["-np", "0"], "-np"),
    (["-b", "0"], "-b"), (["--max-queue", "-1"], "--max-queue"), (["--port", "x"], "--port"),
    (["--pooling", "max"], "--pooling"), (["--no-enable-prefix-caching", "1"], "unrecognized"),
])
def test_server_bad_values(argv, named, capsys):
    with pytest.raises(SystemExit):
        server_args.parse_args(["-m", "x.gguf", *argv])
    assert named in capsys.readouterr().err


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_threads=-1), "Llama: n_threads must be >= 0, got -1"),
    (dict(n_ctx=-8), "Llama: n_ctx must be >= 0, got -8"),
    (dict(n_batch=0), "Llama: n_batch must be >= 1, got 0"),
    (dict(type_k="q6_k"), "Llama: type_k must be a KV cache type.*got 'q6_k'"),
    (dict(type_v=14), "Llama: type_v must be a KV cache type.*got 14"),
    (dict(kv_gpu_cache_mb=-5), "Llama: kv_gpu_cache_mb must be >= 0, got -5"),
    (dict(n_gpu_layers="all"), "Llama: n_gpu_layers must be a whole number, got 'all'"),
    (dict(use_mmap=3), "Llama: use_mmap must be True or False, got 3"),
])
def test_llama_bad_values_name_the_option(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        Llama(str(tmp_path / "never-read.gguf"), **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kv_mb=-1), "LLM: kv_mb must be >= 0, got -1"),
    (dict(kv_host_mb=float("inf")), "LLM: kv_host_mb must be a finite number, got inf"),
    (dict(max_num_seqs=0), "LLM: max_num_seqs must be >= 1, got 0"),
    (dict(max_num_batched_tokens=-3), "LLM: max_num_batched_tokens must be >= 1, got -3"),
    (dict(type_k="int4"), "LLM: type_k must be a KV cache type.*'int4'"),
])
def test_llm_bad_values_name_the_option(kwargs, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        LLM(str(tmp_path / "never-read.gguf"), **kwargs)


def test_unknown_keywords_are_refused(tmp_path):
    path = str(tmp_path / "never-read.gguf")
    with pytest.raises(TypeError, match=r"Llama\(\) got unexpected keyword arguments: n_cxt \(it takes .*n_ctx"):
        Llama(path, n_cxt=64)
    with pytest.raises(TypeError, match=r"LLM\(\) got unexpected keyword arguments: embedding, kv_size"):
        LLM(path, kv_size=1, embedding=True)
    # llama-cpp-python's arguments that change nothing here are taken (and the file then read).
    with pytest.raises(ValueError, match="never-read.gguf"):
        Llama(path, flash_attn=True, use_mlock=False)


def test_signatures_show_the_table():
    llama = inspect.signature(Llama).parameters
    assert list(llama)[0] == "model_path" and llama["n_ctx"].default == 512 and llama["type_k"].default == "f16"
    llm = inspect.signature(LLM).parameters
    assert llm["n_ctx"].default == 4096 and llm["max_num_seqs"].default == 64 and "max_model_len" in llm
    assert all(p.kind is not p.VAR_KEYWORD for p in list(llama.values()) + list(llm.values()))


def test_none_is_the_default():
    values = options.resolve(options.LLAMA, {"n_threads": None, "type_k": None, "n_ctx": None})
    assert values["type_k"] == "f16" and values["n_ctx"] == 512 and values["n_threads"] is None
    assert options.resolve(options.LLM, {"n_ctx": None})["n_ctx"] == 4096


def test_params_structs_from_keywords():
    rng = np.random.default_rng()
    n_ctx, threads, mib = (int(x) for x in rng.integers(1, 1 << 15, 3))
    p = _ember.ContextParams(n_ctx=n_ctx, n_threads=threads, type_v="q8_0", kv_gpu_cache_mb=mib)
    assert (p.n_ctx, p.n_threads, p.type_k, p.type_v, p.kv_gpu_cache_mb) == (n_ctx, threads, "f16", "q8_0", mib)
    assert repr(p).startswith(f"ContextParams(n_ctx={n_ctx}, n_batch=512, n_threads={threads}")
    with pytest.raises(ValueError, match="ContextParams has no field 'n_cxt'; its fields: n_ctx, n_batch"):
        _ember.ContextParams(n_cxt=1)
    with pytest.raises(ValueError, match="type_k must be 'f16', 'bf16', .* or 'iq4_nl', got 'q6_k'"):
        _ember.EngineParams(type_k="q6_k")
    e = _ember.EngineParams(max_num_seqs=threads, enable_prefix_caching=False)
    assert (e.max_num_seqs, e.enable_prefix_caching, e.n_ctx) == (threads, False, 4096)
    assert _ember.ModelParams(n_gpu_layers=-1).n_gpu_layers == -1


def test_fill_sets_the_struct_fields_of_options():
    rng = np.random.default_rng()
    threads, seqs = (int(x) for x in rng.integers(1, 200, 2))
    values = options.resolve(options.LLM, {"n_threads": threads, "max_num_seqs": seqs, "type_v": 8,
                                           "enable_prefix_caching": False, "n_gpu_layers": -1})
    e = options.fill(_ember.EngineParams(), values, n_ctx=77)
    assert (e.n_threads, e.max_num_seqs, e.type_v, e.enable_prefix_caching, e.n_ctx) == (threads, seqs, "q8_0",
                                                                                         False, 77)
    assert options.fill(_ember.ModelParams(), values).n_gpu_layers == -1
    c = options.fill(_ember.ContextParams(), options.resolve(options.LLAMA, {"embedding": True}))
    assert c.embeddings is True and c.n_threads == 0


def test_api_key_from_the_environment(monkeypatch):
    key = f"k{np.random.default_rng().integers(1 << 40)}"
    monkeypatch.setenv("EMBER_API_KEY", key)
    assert server_args.settings(server_args.parse_args(["-m", "x.gguf"])).api_key == key
    assert server_args.settings(server_args.parse_args(["-m", "x.gguf", "--api-key", "other"])).api_key == "other"
    monkeypatch.delenv("EMBER_API_KEY")
    assert server_args.settings(server_args.parse_args(["-m", "x.gguf"])).api_key is None


def test_server_takes_prefix_caching_switch():
    """The option added through the table alone: ember-server's --no-enable-prefix-caching (vLLM's)."""
    assert server_args.engine_kwargs(server_args.parse_args(["-m", "x.gguf"]))["enable_prefix_caching"] is True
    off = server_args.parse_args(["-m", "x.gguf", "--no-enable-prefix-caching"])
    assert server_args.engine_kwargs(off)["enable_prefix_caching"] is False
    on = server_args.parse_args(["-m", "x.gguf", "--no-enable-prefix-caching", "--enable-prefix-caching"])
    assert server_args.engine_kwargs(on)["enable_prefix_caching"] is True


def test_llm_prefix_caching_switch(smollm2_path):
    from ember import SamplingParams
    rng = np.random.default_rng()
    prompt = [int(t) for t in rng.integers(100, 10000, 40)]
    hits = {}
    for on in (True, False):
        with LLM(smollm2_path, n_ctx=128, max_num_seqs=2, n_threads=2, enable_prefix_caching=on) as llm:
            for _ in range(2):
                llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=1), use_tqdm=False)
            hits[on] = llm.stats()["prefix_cache_hits"]
    assert hits[True] > 0 and hits[False] == 0


def test_markdown_is_current():
    assert DOC.read_text() == options_doc.markdown(), "regenerate: python -m ember.options_doc > docs/options.md"


def test_markdown_lists_every_option_and_flag():
    text = options_doc.markdown()
    for option in options.OPTIONS.values():
        assert f"| `{option.name}` |" in text
        for flag in option.flags + option.negative:
            assert f"`{flag}`" in text


def test_parsers_build_from_any_subset():
    parser = argparse.ArgumentParser()
    options.add_arguments(parser, options.SERVER, ["n_threads", "enable_prefix_caching"])
    args = parser.parse_args(["-t", "3", "--no-enable-prefix-caching"])
    assert (args.n_threads, args.enable_prefix_caching) == (3, False)
