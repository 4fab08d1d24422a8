"""ember.detokenize, the text of a completion for Llama and the engine alike: stop strings split
across tokens, UTF-8 characters split across byte tokens, held-back text, several stops, logprob
entries, and bad inputs; on SmolLM2's byte-level tokenizer, with fresh random text each run."""
import numpy as np
import pytest

from ember import _ember
from ember.detokenize import (Detokenizer, completion_logprob_entry, engine_logprob_entry, find_stop,
                              log_softmax, piece_text, stop_prefix_len)

LETTERS = "abcdefghijklmnopqrstuvwxyz"
WIDE = "éßñ€中文😀🙂"   # 2, 3 and 4 bytes in UTF-8


@pytest.fixture(scope="module")
def tok(smollm2_path):
    return _ember.Tokenizer.from_gguf_file(smollm2_path)


@pytest.fixture(scope="module")
def byte_tokens(tok):
    """Byte value -> the token whose piece is that one byte (byte-level BPE has one for each byte
    that UTF-8 text holds)."""
    found = {}
    for t in range(tok.n_vocab):
        piece = bytes(tok.token_to_piece(t, False))
        if len(piece) == 1:
            found.setdefault(piece[0], t)
    assert set((WIDE + LETTERS + " x").encode("utf-8")) <= set(found)
    return found


def random_words(rng, n: int) -> str:
    return " ".join("".join(rng.choice(list(LETTERS), size=rng.integers(1, 8))) for _ in range(n))


def ids_of(tok, text: str):
    return list(tok.encode(text.encode("utf-8"), False, False))


def run(detok, tokens):
    """Pushes tokens until a stop string ends the text; returns the visible text after each push."""
    shown = []
    for t in tokens:
        detok.push(t)
        shown.append(detok.text[:detok.visible_end()])
        if detok.stopped:
            break
    return shown


def test_stop_string_split_across_tokens(tok, rng):
    text = random_words(rng, 40)
    ids = ids_of(tok, text)
    assert bytes(tok.decode(ids, False)).decode() == text
    # A stop string from the middle of a token to the middle of a later one.
    starts = np.cumsum([0] + [len(piece_text(tok, t)) for t in ids])
    k = int(rng.integers(5, len(ids) - 5))
    a, b = starts[k] - 1, starts[k + 1] + 1
    stop = text[a:b]
    cut = text.find(stop)
    d = Detokenizer(tok, [stop])
    shown = run(d, ids)
    assert d.stopped and d.stop_string == stop and d.text == text[:cut]
    # Nothing of the stop string was ever shown, and what was shown only grew.
    for before, after in zip(shown, shown[1:]):
        assert after.startswith(before)
    assert all(len(s) <= cut for s in shown)
    with pytest.raises(RuntimeError, match="stop string"):
        d.push(ids[0])


def test_utf8_split_across_byte_tokens(tok, byte_tokens, rng):
    text = "".join(rng.choice(list(WIDE + LETTERS), size=30))
    data = text.encode("utf-8")
    d = Detokenizer(tok)
    for i, byte in enumerate(data):
        start = d.push(byte_tokens[byte])
        assert start <= len(d.text)
        # Only whole characters come out: the text is the longest decodable prefix of the bytes.
        assert d.text == data[:i + 1].decode("utf-8", errors="ignore")
        assert "\ufffd" not in d.text and d.visible_end() == len(d.text)
    d.flush()
    assert d.text == text


def test_stop_string_of_a_split_character(tok, byte_tokens, rng):
    wide = str(rng.choice([c for c in WIDE if len(c.encode()) >= 3]))
    text = random_words(rng, 3) + wide + random_words(rng, 2)
    d = Detokenizer(tok, [wide + "x", wide])
    run(d, [byte_tokens[b] for b in text.encode("utf-8")])
    assert d.stopped and d.stop_string == wide and d.text == text[:text.index(wide)]


def test_held_back_text_is_released_at_the_end(tok, rng):
    head = random_words(rng, 5)
    stop = "Q" + random_words(rng, 1) + "Z"
    ids = ids_of(tok, head + " " + stop[:-1])
    d = Detokenizer(tok, [stop])
    run(d, ids)
    assert not d.stopped
    # The end that may still grow into the stop string waits...
    assert d.text[d.visible_end():] == stop[:-1]
    d.flush()
    # ...until the text has ended without it.
    assert not d.stopped and d.visible_end() == len(d.text) and d.text == head + " " + stop[:-1]
    with pytest.raises(RuntimeError, match="flush"):
        d.push(ids[0])


def test_flush_can_complete_a_stop_string(tok, byte_tokens):
    # The last character's bytes are held in the C++ detokenizer until flush: a stray lead byte is
    # dropped, a complete character goes out and may finish a stop string.
    d = Detokenizer(tok, ["a€"])
    for b in "xa€".encode("utf-8")[:-1]:
        d.push(byte_tokens[b])
    assert d.text == "xa" and not d.stopped
    d.flush()
    assert not d.stopped and d.text == "xa"   # two of "€"'s three bytes: not a character
    d = Detokenizer(tok, ["a\u00e9"])
    for b in "xa\u00e9".encode("utf-8"):
        d.push(byte_tokens[b])
    assert d.stopped and d.text == "x"


def test_several_stops_the_earliest_wins(tok, rng):
    # Capitals never occur in the random words: the stops match only where they are put.
    after = random_words(rng, 3)
    text = random_words(rng, 10) + " XY " + after + " QR " + random_words(rng, 5)
    stops = ["QR", "XY " + after, "XY"]   # listed out of order; two begin at one place
    d = Detokenizer(tok, stops)
    run(d, ids_of(tok, text))
    assert d.stopped and d.stop_string == "XY" and d.text == text[:text.index("XY")]
    d = Detokenizer(tok, ["QR", "ZZ"])
    run(d, ids_of(tok, text))
    assert d.stopped and d.stop_string == "QR" and d.text == text[:text.index("QR")]


def test_no_stops(tok, rng):
    text = random_words(rng, 20)
    d = Detokenizer(tok, [])
    for t in ids_of(tok, text):
        d.push(t)
        assert d.visible_end() == len(d.text)
    d.flush()
    assert d.text == text and not d.stopped and d.stop_string is None


def test_find_stops_off_skips_a_stop_string(tok):
    # vLLM's min_tokens: a stop string completed while stops are not looked for does not end the text.
    ids = ids_of(tok, "one two three two")
    d = Detokenizer(tok, ["two"])
    for t in ids:
        d.push(t, find_stops=len(d.text) >= len("one two"))
    assert d.stopped and d.text == "one two three "
    d = Detokenizer(tok, ["two"])
    for t in ids:
        d.push(t, find_stops=False)
    d.flush(find_stops=False)
    assert not d.stopped and d.text == "one two three two"


def test_special_tokens_written_out_only_when_asked(tok):
    eos = tok.eos
    special = bytes(tok.token_to_piece(eos, True)).decode()
    assert special
    for flag, expected in ((False, ""), (True, special)):
        d = Detokenizer(tok, [], special=flag)
        d.push(eos)
        d.flush()
        assert d.text == expected


@pytest.mark.parametrize("stops, error, match", [
    ("stop", TypeError, "list of str"),
    (None, TypeError, "list of str"),
    ([b"stop"], TypeError, "must be str"),
    (["ok", 3], TypeError, "must be str"),
    (["ok", ""], ValueError, "cannot be empty"),
])
def test_bad_stop_strings(tok, stops, error, match):
    with pytest.raises(error, match=match):
        Detokenizer(tok, stops)


def test_token_outside_the_vocabulary(tok):
    d = Detokenizer(tok, ["x"])
    for bad in (tok.n_vocab, -1):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            d.push(bad)


def test_stop_helpers():
    assert stop_prefix_len("abc Par", ["Paris", "xyz"]) == 3
    assert stop_prefix_len("abc Paris", ["Paris"]) == 0      # a whole stop string is not a prefix
    assert stop_prefix_len("ab", ["bcd", "abx"]) == 2
    assert stop_prefix_len("ab", []) == 0
    assert find_stop("one two three two", ["two", "three"], 0) == 4
    assert find_stop("one two three two", ["three", "two"], 5) == 8
    assert find_stop("abc", ["zz"], 0) == -1


# ---- logprobs ------------------------------------------------------------------------------
def test_completion_logprob_entry(tok, rng):
    logits = rng.normal(size=tok.n_vocab).astype(np.float32) * 4
    row = log_softmax(logits)
    assert np.isclose(np.exp(row).sum(), 1.0)
    order = np.argsort(-row, kind="stable")
    token = int(order[int(rng.integers(50, 500))])   # a token outside the top k
    e = completion_logprob_entry(tok, row, token, 5)
    assert e["token"] == piece_text(tok, token) and e["logprob"] == pytest.approx(row[token])
    expected = {}
    for i in order[:5]:
        expected.setdefault(piece_text(tok, int(i)), float(row[i]))
    expected[piece_text(tok, token)] = float(row[token])
    assert e["top"] == expected
    assert completion_logprob_entry(tok, row, token, 0)["top"] == {e["token"]: e["logprob"]}


def test_engine_logprob_entry_ranks_ties_alike(tok, rng):
    ids = [int(t) for t in rng.choice(np.arange(1000, 2000), size=4, replace=False)]
    lps = sorted(-rng.random(3) * 3, reverse=True)
    top = [(ids[0], lps[0]), (ids[1], lps[1]), (ids[2], lps[1]), (ids[3], lps[2])]
    entry = engine_logprob_entry(tok, ids[2], lps[1], 2, top, special=False)
    assert list(entry) == ids[2:3] + ids[:2] + ids[3:]
    assert [entry[t].rank for t in ids] == [1, 2, 2, 4]
    assert [float(entry[t]) for t in ids] == [lps[0], lps[1], lps[1], lps[2]]
    assert entry[ids[0]].decoded_token == bytes(tok.token_to_piece(ids[0], False)).decode("utf-8", "replace")
