"""ember-perplexity --kl-divergence-base / --kl-divergence (python/ember/kl_divergence.py): the base file in
llama-perplexity's layout, its log-probability rows, the statistics against float64 numpy, SmolLM2 against
itself and against its own q4_0 KV cache, and the refusals."""
import io
import math
import struct

import numpy as np
import pytest

from conftest import REFERENCE
from ember import _ember, kl_divergence as kl
from ember.perplexity import main as perplexity_main, perplexity

N_CTX = 128


@pytest.fixture(scope="module")
def model(smollm2_path):
    return _ember.Model(smollm2_path)


@pytest.fixture(scope="module")
def text():
    return (REFERENCE / "apache-2.0.txt").read_bytes()


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def test_rows_round_trip(rng):
    """A row holds each log-probability within half its step of the row's 16 nats (below that: the floor),
    a row of equal logits is all zero steps, and rows are an even number of u16."""
    n_vocab = 1001
    logits = (rng.standard_normal((6, n_vocab)) * rng.uniform(0.5, 8, (6, 1))).astype(np.float32)
    logits[5] = 3.0
    rows = kl.encode_rows(logits)
    assert rows.shape == (6, 2 * 501 + 4) and rows.dtype == np.uint16
    got, want = kl.decode_rows(rows, n_vocab), log_softmax(logits)
    scale = rows[:, :4].copy().view(np.float32)[:, 0]
    for r in range(6):
        live = want[r] > want[r].max() - 16
        assert np.all(np.abs(got[r][live] - want[r][live]) <= scale[r] / 2 + 1e-5), r
    assert scale[5] == 0 and np.all(rows[5, 4:] == 0)
    np.testing.assert_allclose(got[5], want[5], atol=1e-5)


def test_stats_against_float64(rng):
    """KL(base || model), the next token's NLL and probability change, top-token agreement, as float64 numpy
    computes them from the same decoded base rows."""
    n, n_vocab = 300, 500
    base_logits = (rng.standard_normal((n, n_vocab)) * 3).astype(np.float32)
    logits = (base_logits + rng.standard_normal((n, n_vocab)).astype(np.float32) * 0.3).astype(np.float32)
    targets = rng.integers(0, n_vocab, n)
    base = kl.decode_rows(kl.encode_rows(base_logits), n_vocab)
    st = kl.Stats()
    st.add(logits, base, targets)
    q, b = log_softmax(logits), base.astype(np.float64)
    live = b > -16
    want_kld = np.where(live, np.exp(b) * (b - q), 0).sum(axis=1)
    got_kld = np.concatenate(st.kld)
    np.testing.assert_allclose(got_kld, want_kld, rtol=1e-4, atol=1e-6)
    assert math.isclose(st.s["nll"], float(-q[np.arange(n), targets].sum()), rel_tol=1e-5)
    p_diff = np.exp(q[np.arange(n), targets]) - np.exp(b[np.arange(n), targets])
    np.testing.assert_allclose(np.concatenate(st.p_diff), p_diff, atol=1e-5)
    assert st.same_top == int((logits.argmax(axis=1) == base.argmax(axis=1)).sum()) and st.count == n
    lines = kl.summary(st)
    assert lines[0] == "====== Perplexity statistics ======" and lines[-1].startswith("Same top p:")
    assert kl.summary(kl.Stats()) == []   # under 100 positions: no statistics


def test_smollm2_base_file_and_self_comparison(model, text, tmp_path):
    """The base file llama-perplexity's layout describes (header, the text's tokens, a row a scored position
    that decodes to the logits' log-softmax), and the model compared with itself: the perplexity it printed,
    KL divergence at the rows' rounding, every top token the same."""
    path = tmp_path / "base.kld"
    out = io.StringIO()
    ppl = perplexity(model, text, N_CTX, 2, out=out, max_chunks=2, base_file=str(path))
    raw = path.read_bytes()
    assert raw[:8] == b"_logits_" and struct.unpack("<Iii", raw[8:20]) == (N_CTX, model.n_vocab, 2)
    base = kl.read_base(str(path))
    tokens = model.tokenizer.encode(text, True, False)
    np.testing.assert_array_equal(base.tokens, np.asarray(tokens[:2 * N_CTX]))
    assert base.rows.shape == (2, N_CTX - 1 - N_CTX // 2, kl.row_words(model.n_vocab))
    chunk = list(tokens[N_CTX:2 * N_CTX])
    if model.tokenizer.add_bos:
        chunk[0] = model.tokenizer.bos
    ctx = _ember.Context(model, n_ctx=N_CTX, n_threads=2)
    ctx.eval(chunk, logits_all=True)
    want = log_softmax(ctx.all_logits()[N_CTX // 2:N_CTX - 1])
    got = kl.decode_rows(base.rows[1], model.n_vocab)
    live = want > want.max(axis=1, keepdims=True) - 16
    assert np.abs(got - want)[live].max() < 2e-4
    out = io.StringIO()
    st = kl.compare(model, base, 2, out=out)
    printed = out.getvalue()
    assert "Mean    KLD:" in printed and "Same top p: 100.000" in printed
    lp, _ = st.mean_and_uncertainty("nll", "nll2")
    assert math.isclose(math.exp(lp), ppl, rel_tol=1e-4)
    kld, _ = st.mean_and_uncertainty("kld", "kld2")
    assert abs(kld) < 1e-6 and st.same_top == st.count   # the rows' rounding: either sign


def test_smollm2_against_its_q4_0_cache(model, text, tmp_path):
    """A q4_0 KV cache moves the distribution: KL divergence well above the self-comparison's, its PPL(Q) the
    perplexity that cache gives, the base's PPL the file's."""
    path = tmp_path / "base.kld"
    base_ppl = perplexity(model, text, N_CTX, 2, out=io.StringIO(), max_chunks=2, base_file=str(path))
    q4_ppl = perplexity(model, text, N_CTX, 2, out=io.StringIO(), max_chunks=2, kv_type="q4_0")
    st = kl.compare(model, kl.read_base(str(path)), 2, out=io.StringIO(), kv_type="q4_0")
    lp, _ = st.mean_and_uncertainty("nll", "nll2")
    lb, _ = st.mean_and_uncertainty("nll_base", "nll_base2")
    assert math.isclose(math.exp(lp), q4_ppl, rel_tol=1e-4) and math.isclose(math.exp(lb), base_ppl, rel_tol=1e-3)
    kld, _ = st.mean_and_uncertainty("kld", "kld2")
    assert 1e-4 < kld < 0.5 and st.same_top < st.count


def test_cli(smollm2_path, tmp_path, capsys):
    text, base = tmp_path / "t.txt", tmp_path / "base.kld"
    text.write_bytes((REFERENCE / "apache-2.0.txt").read_bytes())
    args = ["-m", smollm2_path, "-c", str(N_CTX), "--chunks", "1", "-t", "2"]
    assert perplexity_main(args + ["-f", str(text), "--kl-divergence-base", str(base)]) == 0
    assert perplexity_main(args + ["--kl-divergence-base", str(base), "--kl-divergence"]) == 0
    assert "KL Divergence" in capsys.readouterr().out


@pytest.mark.parametrize("extra, match", [
    (["--kl-divergence"], "--kl-divergence needs --kl-divergence-base FILE"),
    (["--kl-divergence", "--kl-divergence-base", "BASE", "-f", "TEXT"], "give no -f"),
    ([], "-f/--file is required"),
    (["--kl-divergence", "--kl-divergence-base", "TEXT"], "is not a file of log-probabilities"),
    (["--kl-divergence", "--kl-divergence-base", "SHORT"], "is cut short"),
    (["--kl-divergence", "--kl-divergence-base", "VOCAB"], "vocabulary of 7 tokens, the model has"),
])
def test_bad_arguments(smollm2_path, tmp_path, capsys, extra, match):
    files = {"TEXT": tmp_path / "t.txt", "BASE": tmp_path / "b.kld", "SHORT": tmp_path / "s.kld",
             "VOCAB": tmp_path / "v.kld"}
    files["TEXT"].write_bytes(b"some text, not log-probabilities")
    header = b"_logits_" + struct.pack("<Iii", 8, 7, 1)
    files["SHORT"].write_bytes(header + bytes(10))
    files["VOCAB"].write_bytes(header + bytes(4 * 8 + 2 * 3 * kl.row_words(7)))
    argv = ["-m", smollm2_path] + [str(files.get(a, a)) for a in extra]
    assert perplexity_main(argv) == 1
    assert match in capsys.readouterr().err
