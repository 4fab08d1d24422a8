"""ember._ember.Sampler against a numpy reference of the chain (logit_bias -> penalties -> top_k ->
top_p -> min_p -> temperature -> softmax) and llama.cpp's / OpenAI's penalty definitions."""
import math

import numpy as np
import pytest

from conftest import rng_for
from ember import _ember

RNG = None


@pytest.fixture(autouse=True)
def _fresh_rng(request):
    """Each test draws from its own generator, its seed printed (conftest.rng_for)."""
    global RNG
    RNG = rng_for(request.node.name)


def random_logits(n, scale=3.0):
    return (RNG.standard_normal(n) * scale).astype(np.float32)


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """The distribution the sampler must draw from (no penalties), in float64."""
    l = logits.astype(np.float64)
    order = np.argsort(-l, kind="stable")
    keep = np.zeros(len(l), dtype=bool)
    if 0 < top_k < len(l):
        order = order[:top_k]
    if top_p < 1.0:
        w = np.exp(l[order] - l[order[0]])
        cum = np.cumsum(w / w.sum())
        n = int(np.searchsorted(cum, top_p)) + 1   # smallest prefix with mass >= top_p
        order = order[:n]
    if min_p > 0.0:
        order = order[l[order] >= l[order[0]] + math.log(min_p)]
    keep[order] = True
    p = np.where(keep, np.exp((l - l.max()) / temperature), 0.0)
    return p / p.sum()


def draw_counts(sampler, logits, n_draws, history=()):
    counts = np.zeros(len(logits), dtype=np.int64)
    for _ in range(n_draws):
        counts[sampler.sample(logits, list(history))] += 1
    return counts


def assert_matches(counts, probs):
    """Chi-square goodness of fit (p ~ 1e-4 critical values) plus: impossible tokens never drawn."""
    n = counts.sum()
    assert counts[probs == 0].sum() == 0, f"drew excluded tokens {np.nonzero((probs == 0) & (counts > 0))[0]}"
    live = probs > 0
    expected = probs[live] * n
    chi2 = float(((counts[live] - expected) ** 2 / expected).sum())
    df = int(live.sum()) - 1
    # Wilson-Hilferty approximation of the chi-square quantile at z = 3.72 (p = 1e-4).
    crit = df * (1 - 2 / (9 * df) + 3.72 * math.sqrt(2 / (9 * df))) ** 3 if df > 0 else 0.0
    print(f"chi2 {chi2:.1f} df {df} critical {crit:.1f}")
    assert chi2 <= crit


def test_greedy_is_argmax():
    s = _ember.Sampler(temperature=0.0)
    for _ in range(20):
        l = random_logits(49152)
        assert s.sample(l, []) == int(np.argmax(l))


def test_top_k_one_is_greedy():
    s = _ember.Sampler(temperature=1.5, top_k=1, top_p=1.0, min_p=0.0, seed=7)
    for _ in range(20):
        l = random_logits(1000)
        assert s.sample(l, []) == int(np.argmax(l))


def test_same_seed_same_sequence():
    l = random_logits(49152, scale=1.0)
    seqs = [[_s.sample(l, []) for _ in range(50)] for _s in
            (_ember.Sampler(temperature=1.0, seed=1234), _ember.Sampler(temperature=1.0, seed=1234))]
    assert seqs[0] == seqs[1]
    s3 = _ember.Sampler(temperature=1.0, seed=99)
    assert [s3.sample(l, []) for _ in range(50)] != seqs[0]
    # The "random" seed draws from std::random_device: two samplers disagree somewhere.
    r1, r2 = _ember.Sampler(temperature=1.0), _ember.Sampler(temperature=1.0)
    assert [r1.sample(l, []) for _ in range(50)] != [r2.sample(l, []) for _ in range(50)]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_distribution_without_truncation_is_softmax(temperature):
    l = random_logits(12, scale=1.0)
    s = _ember.Sampler(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, seed=int(RNG.integers(1 << 31)))
    assert_matches(draw_counts(s, l, 30000), reference_probs(l, temperature=temperature))


@pytest.mark.parametrize("params", [
    dict(top_k=5, top_p=1.0, min_p=0.0),
    dict(top_k=0, top_p=0.7, min_p=0.0),
    dict(top_k=0, top_p=1.0, min_p=0.15),
    dict(top_k=10, top_p=0.8, min_p=0.05, temperature=0.8),
])
def test_truncated_distribution_matches_reference(params):
    l = random_logits(40, scale=1.5)
    s = _ember.Sampler(seed=int(RNG.integers(1 << 31)), **{"temperature": 1.0, **params})
    assert_matches(draw_counts(s, l, 20000), reference_probs(l, **{"temperature": 1.0, **params}))


def test_top_p_and_min_p_exclude_tokens():
    # probabilities 0.5, 0.3, 0.1, 0.06, 0.04 in a scrambled order
    probs = np.array([0.06, 0.3, 0.04, 0.5, 0.1])
    l = np.log(probs).astype(np.float32) + np.float32(RNG.standard_normal())
    top_p = _ember.Sampler(temperature=1.0, top_k=0, top_p=0.75, min_p=0.0, seed=5)
    assert set(draw_counts(top_p, l, 3000).nonzero()[0]) == {3, 1}          # 0.5 + 0.3 >= 0.75
    min_p = _ember.Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.15, seed=5)
    assert set(draw_counts(min_p, l, 3000).nonzero()[0]) == {3, 1, 4}       # p >= 0.075
    top_k = _ember.Sampler(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=5)
    assert set(draw_counts(top_k, l, 3000).nonzero()[0]) == {3, 1}


def numpy_penalized(logits, history, repeat, freq, presence, last_n):
    l = logits.astype(np.float64).copy()
    window = history if last_n < 0 else history[len(history) - min(last_n, len(history)):]
    ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    for i, c in zip(ids, counts):
        l[i] = l[i] * repeat if l[i] <= 0 else l[i] / repeat
        l[i] -= c * freq + presence
    return l


def test_penalties_match_reference_greedy():
    for _ in range(40):
        n = 64
        l = random_logits(n, scale=1.0)
        history = RNG.integers(0, 8, size=int(RNG.integers(1, 100))).tolist()  # ids 0..7 repeat a lot
        repeat, freq, presence = float(RNG.uniform(1.0, 2.0)), float(RNG.uniform(0, 0.5)), float(RNG.uniform(0, 0.5))
        last_n = int(RNG.choice([-1, 8, 64]))
        s = _ember.Sampler(temperature=0.0, repeat_penalty=repeat, frequency_penalty=freq,
                           presence_penalty=presence, penalty_last_n=last_n)
        want = numpy_penalized(l, history, repeat, freq, presence, last_n)
        assert s.sample(l, history) == int(np.argmax(want))


def test_penalties_change_the_outcome():
    a, b = 3, 7
    l = np.full(10, -5.0, dtype=np.float32)
    l[a], l[b] = 2.0, 1.9
    greedy = dict(temperature=0.0)
    assert _ember.Sampler(**greedy).sample(l, [a]) == a
    assert _ember.Sampler(**greedy, repeat_penalty=1.5).sample(l, [a]) == b       # 2.0 / 1.5 < 1.9
    assert _ember.Sampler(**greedy, presence_penalty=0.2).sample(l, [a]) == b      # 2.0 - 0.2
    assert _ember.Sampler(**greedy, frequency_penalty=0.04).sample(l, [a, a]) == a  # 2.0 - 0.08
    assert _ember.Sampler(**greedy, frequency_penalty=0.04).sample(l, [a, a, a]) == b  # 2.0 - 0.12
    # Negative logits are multiplied: -1.0 * 1.5 < -1.2.
    l[a], l[b] = -1.0, -1.2
    l[l == -5.0] = -9.0
    assert _ember.Sampler(**greedy, repeat_penalty=1.5).sample(l, [a]) == b
    # Outside the last penalty_last_n tokens a repeat is not penalized.
    l[a], l[b] = 2.0, 1.9
    old = [a] + [0] * 4
    assert _ember.Sampler(**greedy, repeat_penalty=1.5, penalty_last_n=4).sample(l, old) == a
    assert _ember.Sampler(**greedy, repeat_penalty=1.5, penalty_last_n=5).sample(l, old) == b
    assert _ember.Sampler(**greedy, repeat_penalty=1.5, penalty_last_n=0).sample(l, old) == a
    assert _ember.Sampler(**greedy, repeat_penalty=1.5, penalty_last_n=-1).sample(l, old) == b


def test_logit_bias():
    l = random_logits(49152)
    top = int(np.argmax(l))
    banned = _ember.Sampler(temperature=0.0, logit_bias={top: -math.inf})
    assert banned.sample(l, []) == int(np.argsort(-l)[1])
    s = _ember.Sampler(temperature=1.0, top_k=5, logit_bias={top: -math.inf}, seed=3)
    assert top not in {s.sample(l, []) for _ in range(300)}
    boosted = _ember.Sampler(temperature=0.0, logit_bias={17: 1000.0})
    assert boosted.sample(l, []) == 17


def test_logits_not_modified_and_float64_accepted():
    l = random_logits(100)
    before = l.copy()
    _ember.Sampler(temperature=1.0, repeat_penalty=2.0, logit_bias={1: 5.0}).sample(l, [1, 2, 3])
    np.testing.assert_array_equal(l, before)
    assert _ember.Sampler(temperature=0.0).sample(l.astype(np.float64), []) == int(np.argmax(l))


@pytest.mark.parametrize("kwargs, name", [
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=math.nan), "top_p"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=1.1), "min_p"),
    (dict(repeat_penalty=0.0), "repeat_penalty"), (dict(repeat_penalty=-1.0), "repeat_penalty"),
    (dict(frequency_penalty=math.inf), "frequency_penalty"),
    (dict(presence_penalty=math.nan), "presence_penalty"),
    (dict(penalty_last_n=-2), "penalty_last_n"), (dict(temperature=math.nan), "temperature"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"), (dict(logit_bias={3: math.inf}), "logit_bias"),
])
def test_invalid_params_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        _ember.Sampler(**kwargs)


def test_invalid_sample_inputs_raise():
    l = random_logits(10)
    with pytest.raises(ValueError, match="logit_bias"):
        _ember.Sampler(logit_bias={10: 1.0}).sample(l, [])
    with pytest.raises(ValueError, match="history"):
        _ember.Sampler(repeat_penalty=1.1).sample(l, [3, 12])
    with pytest.raises(ValueError, match="-inf"):
        _ember.Sampler(logit_bias={i: -math.inf for i in range(10)}).sample(l, [])
    with pytest.raises(ValueError, match="n_vocab"):
        _ember.Sampler().sample(np.zeros(0, dtype=np.float32), [])
