"""Inputs the fuzzers (tests/fuzz/, tools/ci/fuzz.sh) found, replayed through the public bindings.
Each test names the fuzz target and what went wrong before the fix."""
import math

import numpy as np
import pytest

from ember import _ember

INF = math.inf


def draws(sampler, logits, n=3):
    """n draws, each appended to the history the next one is penalized by (as fuzz_sampler does)."""
    logits = np.asarray(logits, dtype=np.float32)
    history = []
    for _ in range(n):
        history.append(sampler.sample(logits, history))
    return history


def test_sampler_penalty_overflow_to_inf():
    # fuzz_sampler: repeat_penalty=1e-30 divides a positive logit up to +inf, and top_p's bucket
    # arithmetic then cast inf * 0 = NaN to int (UBSan: undefined behaviour) and every softmax
    # weight became NaN. A +inf logit is now a certainty.
    s = _ember.Sampler(temperature=1e-30, top_k=-2, top_p=1e-30, min_p=1e-30, repeat_penalty=1e-30,
                       frequency_penalty=0.0, presence_penalty=1e-30, penalty_last_n=6, seed=940525566678597667)
    assert draws(s, [3.27133e32] + [0.0] * 38) == [0, 0, 0]


@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (0, 1.0), (2, 0.9), (0, 0.5)])
def test_sampler_inf_logit_is_certain(top_k, top_p):
    s = _ember.Sampler(temperature=1.0, top_k=top_k, top_p=top_p, min_p=0.0, seed=1)
    assert draws(s, [0.0, 1.0, INF, 2.0, INF]) == [2, 2, 2]


def test_sampler_logit_span_overflowing_float():
    # fuzz_sampler: finite logits whose difference overflows a float (top_p's bucket span).
    s = _ember.Sampler(temperature=1.0, top_k=0, top_p=0.5, min_p=0.0, seed=2)
    assert draws(s, [-3e38, 3e38, 0.0]) == [1, 1, 1]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampler_minus_inf_bias_bans_an_inf_logit(temperature):
    # fuzz_sampler: +inf + (-inf) was NaN; the banned token must never be drawn.
    s = _ember.Sampler(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0, logit_bias={0: -INF}, seed=3)
    assert 0 not in draws(s, [INF, 0.0, 1.0])
    with pytest.raises(ValueError, match="no token can be drawn"):
        _ember.Sampler(temperature=temperature, logit_bias={0: -INF}).sample(np.array([INF], np.float32), [])


def test_sampler_penalty_of_inf_logit_is_not_nan():
    # fuzz_sampler: +inf minus a frequency penalty that overflowed to +inf was NaN (a NaN breaks
    # the candidates' sort order); such a token is now never drawn.
    s = _ember.Sampler(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, frequency_penalty=3e38, seed=4)
    logits = np.array([INF, 0.0, 1.0], np.float32)
    for _ in range(20):
        assert s.sample(logits, [0, 0, 0, 0]) in (1, 2)


def test_sampler_temperature_below_float_reciprocal_is_greedy():
    # fuzz_sampler: 1/temperature = inf made every weight NaN (0 * inf) and the draw fell through
    # to the last candidate, even a banned one; such a temperature now samples greedily.
    s = _ember.Sampler(temperature=1e-45, top_k=0, top_p=1.0, min_p=0.0, logit_bias={3: -INF}, seed=5)
    assert draws(s, [0.0, 5.0, 1.0, 2.0], n=1) == [1]


@pytest.mark.parametrize("temperature", [INF, -INF])
def test_sampler_rejects_infinite_temperature(temperature):
    with pytest.raises(ValueError, match="temperature"):
        _ember.Sampler(temperature=temperature)
