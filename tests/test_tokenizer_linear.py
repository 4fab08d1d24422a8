"""Special-token partitioning is linear in the text (a prompt of special tokens cannot stall the
server) and exactly llama.cpp's longest-first partition, checked against a plain reference on
random texts with overlapping special tokens."""
import random
import time

import pytest

from ember._ember import Tokenizer

CONTROL, USER_DEFINED = 3, 4


def reference_partition(text: bytes, specials):
    """llama.cpp's partition: special tokens longest first (ties in vocab order), each claiming its
    places left to right in what plain text is left. specials: (id, bytes, type)."""
    frags = [(-1, 0, len(text))]
    for tid, s, _ in sorted(specials, key=lambda x: -len(x[1])):
        out = []
        for tok, b, e in frags:
            if tok >= 0 or e - b < len(s):
                out.append((tok, b, e))
                continue
            pos = b
            while (hit := text.find(s, pos, e)) >= 0:
                if hit > pos:
                    out.append((-1, pos, hit))
                out.append((tid, hit, hit + len(s)))
                pos = hit + len(s)
            if pos < e:
                out.append((-1, pos, e))
        frags = out
    return frags


def letters_tokenizer(rng, n_special):
    """A byte-level BPE vocabulary of single letters (no merges: plain text is a token a byte) and
    random special tokens of 2-4 letters, some control and some user-defined."""
    letters = ["a", "b", "c"]
    specials, seen = [], set()
    while len(specials) < n_special:
        s = "".join(rng.choice(letters) for _ in range(rng.randint(2, 4)))
        if s not in seen:
            seen.add(s)
            specials.append((len(letters) + len(specials), s.encode(), rng.choice([CONTROL, USER_DEFINED])))
    tokens = letters + [s.decode() for _, s, _ in specials]
    types = [1] * len(letters) + [t for _, _, t in specials]
    return Tokenizer.from_vocab("gpt2", tokens, token_types=types), specials


def expected_ids(text: bytes, specials):
    ids = []
    for tok, b, e in reference_partition(text, specials):
        ids += [tok] if tok >= 0 else [b"abc".index(text[i:i + 1]) for i in range(b, e)]
    return ids


@pytest.mark.parametrize("seed", range(6))
def test_partition_matches_the_longest_first_reference(seed):
    rng = random.Random(seed)
    tok, specials = letters_tokenizer(rng, rng.randint(1, 12))
    for _ in range(50):
        text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 60))).encode()
        assert tok.encode(text, False, True) == expected_ids(text, specials), text
        user = [s for s in specials if s[2] == USER_DEFINED]   # control tokens only when asked for
        assert tok.encode(text, False, False) == expected_ids(text, user), text


@pytest.fixture(scope="module")
def smol(smollm2_path):
    return Tokenizer.from_gguf_file(smollm2_path)


def timed_encode(tok, text: bytes, special=True):
    t0 = time.perf_counter()
    ids = tok.encode(text, False, special)
    return ids, time.perf_counter() - t0


def test_two_mib_of_special_tokens_in_well_under_a_second(smol):
    unit = "<|im_start|>" + "y" * 20
    text = (unit * (2 * 1024 * 1024 // len(unit))).encode()
    ids, seconds = timed_encode(smol, text)
    assert seconds < 1.0, f"{len(text)} bytes took {seconds:.2f} s"
    per_unit = smol.encode(unit.encode(), False, True)
    assert ids == per_unit * (len(text) // len(unit.encode()))
    # Twice the text, about twice the time (quadratic matching took 4x per doubling).
    _, seconds_2x = timed_encode(smol, text * 2)
    assert seconds_2x < 4 * max(seconds, 0.05)


def test_near_misses_and_long_plain_text_are_linear(smol):
    rng = random.Random(7)
    near = ("<|im_star" + rng.choice("xyz") + "|>" for _ in range(200_000))   # a prefix walk at each '<'
    plain = bytes(rng.choice(b"ab ") for _ in range(1 << 21))
    for text in ("".join(near).encode(), ("<|" * (1 << 20)).encode(), plain):
        _, seconds = timed_encode(smol, text)
        assert seconds < 2.0, f"{len(text)} bytes ({text[:20]!r}...) took {seconds:.2f} s"
