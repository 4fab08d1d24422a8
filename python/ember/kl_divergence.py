"""ember-perplexity's --kl-divergence-base / --kl-divergence: a base model's log-probabilities saved in
llama-perplexity's file layout, and another model (a quantization of it) compared with them as
llama-perplexity compares: KL divergence, top-token agreement, the change in each next token's
probability, each with its statistics.

The file: b"_logits_", n_ctx (u32), n_vocab (i32), n_chunk (i32), the n_chunk * n_ctx tokens (i32, as
tokenized: a chunk's BOS goes in at evaluation), then for each chunk its scored positions n_ctx/2 ..
n_ctx-2, a row of 2 * ceil(n_vocab / 2) + 4 u16 each: f32 scale and f32 min_log_prob, then each token's
log-probability q as u16 (log p = scale * q + min_log_prob over the 16 nats below the largest logit; 0
below), padded to an even count.
"""
import math
import sys
import time
from typing import Optional

import numpy as np

from . import _ember

MAGIC = b"_logits_"


def row_words(n_vocab: int) -> int:
    return 2 * ((n_vocab + 1) // 2) + 4


def log_sum_exp(logits: np.ndarray) -> tuple:
    """Each row's largest logit (f32) and log sum exp(logit - largest) (f32 of a float64 sum)."""
    peak = logits.max(axis=1)
    total = np.exp((logits - peak[:, None]).astype(np.float32)).astype(np.float64).sum(axis=1)
    return peak, np.log(total).astype(np.float32)


def encode_rows(logits: np.ndarray) -> np.ndarray:
    """Rows of logits [n, n_vocab] f32 as the file's u16 rows of log-probabilities."""
    logits = np.asarray(logits, dtype=np.float32)
    n, n_vocab = logits.shape
    peak, lse = log_sum_exp(logits)
    low = np.maximum(logits.min(axis=1), peak - np.float32(16))
    min_log_prob = (low - peak - lse).astype(np.float32)
    scale = ((peak - low) / np.float32(65535)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(scale != 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    q = np.rint(inv[:, None] * (logits - low[:, None]))   # nearest, ties to even
    q = np.where((logits > low[:, None]) & (scale[:, None] != 0), q, 0).astype(np.uint16)
    rows = np.zeros((n, row_words(n_vocab)), dtype=np.uint16)
    rows[:, :4] = np.stack([scale, min_log_prob], axis=1).view(np.uint16)
    rows[:, 4:4 + n_vocab] = q
    return rows


def decode_rows(rows: np.ndarray, n_vocab: int) -> np.ndarray:
    """The file's u16 rows back as log-probabilities [n, n_vocab] f32."""
    head = np.ascontiguousarray(rows[:, :4]).view(np.float32)
    return head[:, :1] * rows[:, 4:4 + n_vocab].astype(np.float32) + head[:, 1:2]


class BaseWriter:
    """Writes a base file: the header and tokens now, then each chunk's scored rows."""

    def __init__(self, path: str, n_ctx: int, n_vocab: int, n_chunk: int, tokens):
        if len(tokens) != n_ctx * n_chunk:
            raise ValueError(f"a base file of {n_chunk} chunks of {n_ctx} needs {n_ctx * n_chunk} tokens, got "
                             f"{len(tokens)}")
        self.f = open(path, "wb")
        self.f.write(MAGIC + np.array([n_ctx], "<u4").tobytes() + np.array([n_vocab, n_chunk], "<i4").tobytes())
        self.f.write(np.asarray(tokens, dtype="<i4").tobytes())

    def write_chunk(self, logits: np.ndarray):
        self.f.write(encode_rows(logits).astype("<u2").tobytes())

    def close(self):
        self.f.close()


class Base:
    """A base file opened for reading: its header, tokens and each chunk's rows (memory-mapped)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            head = f.read(20)
        if len(head) < 20 or head[:8] != MAGIC:
            raise ValueError(f"{path} is not a file of log-probabilities (llama-perplexity's "
                             f"--kl-divergence-base layout starts with {MAGIC!r})")
        self.n_ctx = int(np.frombuffer(head[8:12], "<u4")[0])
        self.n_vocab, self.n_chunk = (int(v) for v in np.frombuffer(head[12:20], "<i4"))
        if self.n_ctx < 4 or self.n_vocab < 1 or self.n_chunk < 1:
            raise ValueError(f"{path}: bad header (n_ctx {self.n_ctx}, n_vocab {self.n_vocab}, "
                             f"n_chunk {self.n_chunk})")
        self.first = self.n_ctx // 2
        self.n_scored = self.n_ctx - 1 - self.first
        n_tokens = self.n_ctx * self.n_chunk
        need = 20 + 4 * n_tokens + 2 * self.n_chunk * self.n_scored * row_words(self.n_vocab)
        data = np.memmap(path, dtype=np.uint8, mode="r")
        if data.size < need:
            raise ValueError(f"{path} is cut short: {data.size} bytes, its header calls for {need} "
                             f"({self.n_chunk} chunks of {self.n_ctx}, vocabulary {self.n_vocab})")
        self.tokens = np.frombuffer(data[20:20 + 4 * n_tokens], "<i4")
        self.rows = np.frombuffer(data[20 + 4 * n_tokens:need], "<u2").reshape(
            self.n_chunk, self.n_scored, row_words(self.n_vocab))


def read_base(path: str) -> Base:
    return Base(path)


class Stats:
    """The running sums llama-perplexity keeps, and every position's KL divergence and Δp."""

    def __init__(self):
        self.s = dict.fromkeys(("nll", "nll2", "nll_base", "nll_base2", "nll_nll_base", "kld", "kld2", "p_diff",
                                "p_diff2", "p_diff4"), 0.0)
        self.same_top = self.count = 0
        self.kld, self.p_diff = [], []

    def add(self, logits: np.ndarray, base_log_p: np.ndarray, targets: np.ndarray):
        """One chunk: logits [n, n_vocab] of the model, base_log_p [n, n_vocab] (decode_rows), targets [n]."""
        logits = np.asarray(logits, dtype=np.float32)
        idx = np.arange(len(targets))
        peak, lse = log_sum_exp(logits)
        nll = (peak + lse - logits[idx, targets]).astype(np.float32)
        nll_base = -base_log_p[idx, targets]
        norm = (peak + lse).astype(np.float32)
        # KL(base || model) over the base's tokens within 16 nats of its top
        live = base_log_p > np.float32(-16)
        terms = np.where(live, np.exp(base_log_p) * (base_log_p - logits + norm[:, None]), 0)
        kld = terms.astype(np.float64).sum(axis=1)
        p_diff = (np.exp(-nll) - np.exp(-nll_base)).astype(np.float32)
        s = self.s
        s["nll"] += float(nll.astype(np.float64).sum())
        s["nll2"] += float((nll.astype(np.float64) ** 2).sum())
        s["nll_base"] += float(nll_base.astype(np.float64).sum())
        s["nll_base2"] += float((nll_base.astype(np.float64) ** 2).sum())
        s["nll_nll_base"] += float((nll.astype(np.float64) * nll_base).sum())
        s["kld"] += float(kld.sum())
        s["kld2"] += float((kld ** 2).sum())
        p64 = p_diff.astype(np.float64)
        s["p_diff"] += float(p64.sum())
        s["p_diff2"] += float((p64 ** 2).sum())
        s["p_diff4"] += float((p64 ** 4).sum())
        self.same_top += int((logits.argmax(axis=1) == base_log_p.argmax(axis=1)).sum())
        self.count += len(targets)
        self.kld.append(kld.astype(np.float32))
        self.p_diff.append(p_diff)

    def mean_and_uncertainty(self, key: str, key2: str) -> tuple:
        if self.count < 1:
            return 0.0, 0.0
        f = self.s[key] / self.count
        df = self.s[key2] / self.count - f * f
        return f, (math.sqrt(df / (self.count - 1)) if df > 0 and self.count > 10 else 0.0)

    def log_ppl_covariance(self) -> float:
        if self.count < 10:
            return 0.0
        n = self.count
        return (self.s["nll_nll_base"] / n - (self.s["nll"] / n) * (self.s["nll_base"] / n)) / (n - 1)

    def chunk_line(self, chunk: int) -> str:
        lp, lp_u = self.mean_and_uncertainty("nll", "nll2")
        lb, lb_u = self.mean_and_uncertainty("nll_base", "nll_base2")
        ratio_u = math.sqrt(max(lp_u * lp_u + lb_u * lb_u - 2 * self.log_ppl_covariance(), 0.0))
        kl, kl_u = self.mean_and_uncertainty("kld", "kld2")
        rms, rms_u = self.p_diff_rms()
        top, top_u = self.same_top_share()
        ppl = math.exp(lp)
        return (f"{chunk:4d}    {ppl:9.4f} ± {ppl * lp_u:9.4f}    {lp - lb:10.5f} ± {ratio_u:10.5f}    "
                f"{kl:10.5f} ± {kl_u:10.5f}    {100 * rms:6.3f} ± {100 * rms_u:6.3f} %    "
                f"{100 * top:6.3f} ± {100 * top_u:6.3f} %")

    def p_diff_rms(self) -> tuple:
        mse, mse_u = self.mean_and_uncertainty("p_diff2", "p_diff4")
        rms = math.sqrt(mse)
        return rms, (0.5 / rms * mse_u if rms > 0 else 0.0)

    def same_top_share(self) -> tuple:
        top = self.same_top / self.count
        return top, (math.sqrt(top * (1 - top) / (self.count - 1)) if self.count > 1 else 0.0)


def percentile(values: np.ndarray, fraction: float) -> float:
    """As llama-perplexity's: linear between the sorted values around fraction * (n - 1)."""
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = np.float32(fraction) * np.float32(len(values) - 1)
    i = int(p)
    p -= i
    return float((1 - p) * values[i] + p * values[min(i + 1, len(values) - 1)])


def median(values: np.ndarray) -> float:
    n = len(values)
    return float(values[n // 2] if n % 2 else np.float32(0.5) * (values[n // 2] + values[n // 2 - 1]))


def summary(st: Stats) -> list:
    """The statistics llama-perplexity prints after the chunks (none below 100 positions)."""
    if st.count < 100:
        return []
    kld, p_diff = np.sort(np.concatenate(st.kld)), np.sort(np.concatenate(st.p_diff))
    lp, lp_u = st.mean_and_uncertainty("nll", "nll2")
    lb, lb_u = st.mean_and_uncertainty("nll_base", "nll_base2")
    ppl, ppl_b = math.exp(lp), math.exp(lb)
    cov = st.log_ppl_covariance()
    ratio_u = math.sqrt(max(lp_u * lp_u + lb_u * lb_u - 2 * cov, 0.0))
    cor = cov / (lp_u * lb_u) if lp_u * lb_u > 0 else 0.0
    diff_u = math.sqrt(max((ppl * lp_u) ** 2 + (ppl_b * lb_u) ** 2 - 2 * ppl * ppl_b * cov, 0.0))
    kl, kl_u = st.mean_and_uncertainty("kld", "kld2")
    pd, pd_u = st.mean_and_uncertainty("p_diff", "p_diff2")
    rms, rms_u = st.p_diff_rms()
    top, top_u = st.same_top_share()
    lines = ["====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {ppl:10.6f} ± {ppl * lp_u:10.6f}",
             f"Mean PPL(base)                : {ppl_b:10.6f} ± {ppl_b * lb_u:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * cor:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {lp - lb:10.6f} ± {ratio_u:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {math.exp(lp - lb):10.6f} ± {math.exp(lp - lb) * ratio_u:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {ppl - ppl_b:10.6f} ± {diff_u:10.6f}", "",
             "====== KL divergence statistics ======",
             f"Mean    KLD: {kl:10.6f} ± {kl_u:10.6f}", f"Maximum KLD: {kld[-1]:10.6f}"]
    for label, f in (("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9)):
        lines.append(f"{label}   KLD: {percentile(kld, f):10.6f}")
    lines.append(f"Median  KLD: {median(kld):10.6f}")
    for label, f in (("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01), (" 0.1%", 0.001)):
        lines.append(f"{label}   KLD: {percentile(kld, f):10.6f}")
    lines += [f"Minimum KLD: {kld[0]:10.6f}", "", "====== Token probability statistics ======",
              f"Mean    Δp: {100 * pd:6.3f} ± {100 * pd_u:5.3f} %", f"Maximum Δp: {100 * p_diff[-1]:6.3f}%"]
    for label, f in (("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.9), ("75.0%", 0.75)):
        lines.append(f"{label}   Δp: {100 * percentile(p_diff, f):6.3f}%")
    lines.append(f"Median  Δp: {100 * median(p_diff):6.3f}%")
    for label, f in (("25.0%", 0.25), ("10.0%", 0.1), (" 5.0%", 0.05), (" 1.0%", 0.01), (" 0.1%", 0.001)):
        lines.append(f"{label}   Δp: {100 * percentile(p_diff, f):6.3f}%")
    lines += [f"Minimum Δp: {100 * p_diff[0]:6.3f}%", f"RMS Δp    : {100 * rms:6.3f} ± {100 * rms_u:5.3f} %",
              f"Same top p: {100 * top:6.3f} ± {100 * top_u:5.3f} %"]
    return lines


def compare(model, base: Base, n_threads: int, n_batch: int = 0, out=None, max_chunks: int = 0,
            kv_type: Optional[str] = None, **context_fields) -> Stats:
    """The model against the base file on its tokens (its first max_chunks chunks when > 0); prints
    a line a chunk and the statistics (to out) and returns them."""
    out = out or sys.stdout
    if base.n_vocab != model.n_vocab:
        raise ValueError(f"{base.path} holds a vocabulary of {base.n_vocab} tokens, the model has {model.n_vocab}")
    kv = {} if kv_type is None else {"type_k": kv_type, "type_v": kv_type}
    n_ctx, first = base.n_ctx, base.first
    ctx = _ember.Context(model, n_ctx=n_ctx, n_batch=n_batch or n_ctx, n_threads=n_threads, **kv, **context_fields)
    n_chunk = min(base.n_chunk, max_chunks) if max_chunks > 0 else base.n_chunk
    tok = model.tokenizer
    print(f"kl_divergence: computing over {n_chunk} chunks, n_ctx={n_ctx}", file=out)
    print("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS"
          "            Same top p", file=out)
    st = Stats()
    start = time.perf_counter()
    for c in range(n_chunk):
        chunk = [int(t) for t in base.tokens[c * n_ctx:(c + 1) * n_ctx]]
        targets = np.asarray(chunk[first + 1:], dtype=np.int64)
        if tok.add_bos:
            chunk[0] = tok.bos
        ctx.truncate(0)
        ctx.eval(chunk, logits_all=True)
        st.add(ctx.all_logits()[first:n_ctx - 1], decode_rows(base.rows[c], base.n_vocab), targets)
        print(st.chunk_line(c + 1), file=out, flush=True)
    print(f"{n_chunk * n_ctx / (time.perf_counter() - start):.1f} tokens/s", file=out)
    print(file=out)
    for line in summary(st):
        print(line, file=out)
    return st
