"""The runtime switch registry (src/backend/switches.cpp, ember.switches): every EMBER_* switch is
declared once, resolved override > environment > fallback into a snapshot when a backend is made,
checked against its allowed values; docs/switches.md is generated from the table."""
import re

import numpy as np
import pytest

from conftest import ROOT, at_simd_level, kernel_module, simd_levels, switches_overridden
from ember import _ember, switches

K = kernel_module()
F32 = 0   # ggml type id


def row(name):
    return next(r for r in switches.table() if r["name"] == name)


def test_the_table_declares_each_switch_once_with_a_meaning():
    rows = switches.table()
    names = [r["name"] for r in rows]
    assert len(names) == len(set(names))
    assert {"EMBER_SIMD", "EMBER_CPU_HANDOUT_KB", "EMBER_STREAM", "EMBER_STREAM_PIN", "EMBER_CUDA_GRAPHS",
            "EMBER_CUDA_GEMM_DQ_ROWS"} <= set(names)
    for r in rows:
        assert re.fullmatch(r"EMBER_[A-Z0-9_]+", r["name"]) and len(r["meaning"]) > 20, r
        assert r["values"] == "integer" or r["fallback"] in r["values"].split("|") + [""], r


def test_no_switch_is_read_outside_the_table():
    """The one place a switch is declared: no C++ source but the registry calls getenv, and every EMBER_* name
    they hand a Switches reader is a row; the Python package and the tests read no EMBER_* variable
    but the ones docs/switches.md lists as other variables."""
    declared = {r["name"] for r in switches.table()}
    other = {name for name, _ in switches.OTHER_VARIABLES}
    for path in [*ROOT.glob("src/**/*"), *ROOT.glob("cuda/**/*")]:
        if path.suffix not in (".cpp", ".cu", ".h", ".cuh") or path.stem == "switches":
            continue
        text = path.read_text()
        assert "getenv(" not in text, f"{path.relative_to(ROOT)} reads the environment: declare a switch instead"
        for name in re.findall(r'"(EMBER_[A-Z0-9_]+)"', text):
            assert name in declared, f"{path.relative_to(ROOT)} reads {name}, which switch_table() does not declare"
    for path in [*ROOT.glob("python/ember/**/*.py"), *ROOT.glob("tests/*.py")]:
        for name in re.findall(r'(?:environ(?:\.get\(|\[)\s*|env=)"(EMBER_[A-Z0-9_]+)"', path.read_text()):
            assert name in other, f"{path.relative_to(ROOT)} reads {name}: a switch belongs in switch_table()"


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown switch 'EMBER_NOPE' \(known: .*EMBER_SIMD"):
        _ember.set_switch("EMBER_NOPE", "1")
    with pytest.raises(ValueError, match="unknown switch 'EMBER_CUDA_GRAPH'"):
        with switches.overridden(EMBER_STREAM="0", EMBER_CUDA_GRAPH="0"):
            pass
    assert row("EMBER_STREAM")["override"] == ""   # the switches set before the bad one are restored


@pytest.mark.parametrize("name,value,message", [
    ("EMBER_CUDA_GRAPHS", "yes", r"EMBER_CUDA_GRAPHS must be 0 or 1 \(got 'yes'\)"),
    ("EMBER_STREAM", "2", r"EMBER_STREAM must be 0 or 1"),
    ("EMBER_SIMD", "sse4", r"EMBER_SIMD must be scalar, avx2, avx512 or neon \(got 'sse4'\)"),
    ("EMBER_CPU_HANDOUT_KB", "-3", r"EMBER_CPU_HANDOUT_KB must be a whole number >= 0 \(got '-3'\)"),
    ("EMBER_CPU_HANDOUT_KB", "1.5", r"EMBER_CPU_HANDOUT_KB must be a whole number"),
    ("EMBER_CUDA_GEMM_DQ_ROWS", "128", r"EMBER_CUDA_GEMM_DQ_ROWS must be 0, 192 or 256"),
])
def test_a_value_the_switch_does_not_take_is_refused(name, value, message):
    before = row(name)["value"]
    with pytest.raises(ValueError, match=message):
        _ember.set_switch(name, value)
    with pytest.raises(ValueError, match=message):
        with switches.overridden(**{name: value}):
            pass
    assert row(name)["value"] == before and row(name)["override"] == ""


def test_a_bad_environment_value_fails_when_a_backend_is_made(monkeypatch):
    monkeypatch.setenv("EMBER_CUDA_PDL", "on")
    with pytest.raises(ValueError, match=r"EMBER_CUDA_PDL must be 0 or 1 \(got 'on' from the environment\)"):
        switches.table()
    with pytest.raises(ValueError, match="EMBER_CUDA_PDL"):
        K.Backend("cpu", 1)
    with switches_overridden(EMBER_CUDA_PDL="1"):   # an override wins: the environment is not read
        assert row("EMBER_CUDA_PDL")["value"] == "1"
        K.Backend("cpu", 1)


def test_override_beats_environment_beats_fallback(monkeypatch, rng):
    name = "EMBER_CPU_HANDOUT_KB"
    env, over, inner = (str(v) for v in rng.choice(np.arange(1, 1 << 20), 3, replace=False))
    monkeypatch.delenv(name, raising=False)
    assert row(name)["value"] == row(name)["fallback"] == "256"
    monkeypatch.setenv(name, "")   # empty counts as unset
    assert row(name)["value"] == "256"
    monkeypatch.setenv(name, env)
    assert row(name)["value"] == env
    with switches.overridden(**{name: over}):
        assert (row(name)["value"], row(name)["override"]) == (over, over)
        with switches.overridden(**{name: inner}):
            assert row(name)["value"] == inner
        assert row(name)["value"] == over   # the outer override is back
    assert (row(name)["value"], row(name)["override"]) == (env, "")
    _ember.set_switch(name, over)
    assert row(name)["value"] == over
    _ember.set_switch(name, "")   # "" clears the override
    assert (row(name)["value"], row(name)["override"]) == (env, "")
    switches.set_switch(name, int(over))
    switches.set_switch(name, None)
    assert row(name)["value"] == env


def test_a_snapshot_is_fixed_when_the_backend_is_made(rng):
    """A backend keeps the switch values it was made with: F32 dot products at the scalar level
    (vec_dot's reference bits) and at this CPU's SIMD level (other sums of the same terms) stay as
    they were, whatever the switch says later."""
    if len(simd_levels("scalar")) < 2:
        pytest.skip("this CPU runs the scalar kernels only")
    n_in, n_out = 4096, 48
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    wb = w.view(np.uint8).reshape(n_out, -1)
    x = rng.standard_normal((1, n_in)).astype(np.float32)
    with at_simd_level("scalar"):
        scalar = K.Backend("cpu", 1)
        ref = np.array([K.vec_dot(F32, wb[o], x[0], impl="ref") for o in range(n_out)], np.float32)
    best = K.Backend("cpu", 1)
    y_scalar, y_best = scalar.matmul(F32, wb, n_in, x), best.matmul(F32, wb, n_in, x)
    np.testing.assert_array_equal(y_scalar[0].view(np.uint32), ref.view(np.uint32))
    assert (y_best != y_scalar).any(), "the SIMD level gave the scalar sums: the level did not reach the backend"
    with at_simd_level("scalar"):
        np.testing.assert_array_equal(best.matmul(F32, wb, n_in, x).view(np.uint32), y_best.view(np.uint32))
    np.testing.assert_array_equal(scalar.matmul(F32, wb, n_in, x).view(np.uint32), y_scalar.view(np.uint32))


def test_a_live_context_keeps_the_switches_it_was_made_with(smollm2_path, rng):
    """A context's CPU backend is made with the context: a context made under EMBER_SIMD=scalar keeps
    the scalar kernels after the override is gone, one made before an override keeps its level."""
    if len(simd_levels("scalar")) < 2:
        pytest.skip("this CPU runs the scalar kernels only")
    model = _ember.Model(smollm2_path)
    tokens = rng.integers(0, model.n_vocab, 12).tolist()

    def logits(ctx):
        ctx.eval(tokens, logits_all=True)
        out = np.array(ctx.all_logits(), np.float32)
        ctx.truncate(0)
        return out

    best = _ember.Context(model, n_ctx=64, n_threads=2)
    with switches.overridden(EMBER_SIMD="scalar"):
        scalar = _ember.Context(model, n_ctx=64, n_threads=2)
        scalar_inside, best_inside = logits(scalar), logits(best)
    np.testing.assert_array_equal(logits(scalar).view(np.uint32), scalar_inside.view(np.uint32))
    np.testing.assert_array_equal(logits(best).view(np.uint32), best_inside.view(np.uint32))
    if simd_levels()[0] == "avx512":   # Q4_1 and Q8_0 take the AVX-512 single-token kernels: other sums
        assert (scalar_inside != best_inside).any(), "the context made under EMBER_SIMD=scalar kept the SIMD kernels"


def test_the_doc_is_the_table(capsys):
    switches.main(["--markdown"])
    doc = capsys.readouterr().out
    assert doc == switches.markdown()
    committed = (ROOT / "docs" / "switches.md").read_text()
    assert committed == doc, "docs/switches.md is stale: python -m ember.switches --markdown > docs/switches.md"
    for r in switches.table():
        assert f"`{r['name']}`" in doc


def test_the_listing_shows_values_and_overrides(capsys):
    with switches.overridden(EMBER_CUDA_FUSE="0"):
        switches.main([])
    lines = capsys.readouterr().out.splitlines()
    assert "EMBER_CUDA_FUSE=0 (override)" in lines
    assert len(lines) == len(switches.table())
