"""ember.chat.harmony: gpt-oss's harmony replies split into content (final channel) and reasoning
(analysis channel), whole and as the text streams in at any split, markers cut in two included."""
import random

import pytest

from ember.chat.harmony import HarmonySplitter, is_harmony_template, split_harmony

REPLY = ("<|channel|>analysis<|message|>User asks 2+2. Easy: 4. Note <|x|> is not a marker.<|end|>"
         "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4; a < b and a <| b.<|return|>")
CASES = [
    (REPLY, "2 + 2 = 4; a < b and a <| b.", "User asks 2+2. Easy: 4. Note <|x|> is not a marker."),
    # A preamble on the commentary channel is content; <|constrain|> is markup.
    ("<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary<|message|>Checking."
     "<|end|><|start|>assistant<|channel|>final<|message|>Done<|return|>", "Checking.Done", "think"),
    ("<|channel|>final<|message|>only the answer", "only the answer", ""),
    ("<|channel|>analysis<|message|>cut off mid-thought", "", "cut off mid-thought"),
    ("plain text with no markup <|", "plain text with no markup <|", ""),
    ("", "", ""),
]


@pytest.mark.parametrize("text,content,reasoning", CASES)
def test_split_whole_reply(text, content, reasoning):
    assert split_harmony(text) == (content, reasoning)


@pytest.mark.parametrize("text,content,reasoning", CASES)
def test_streamed_in_random_pieces_gives_the_same_split(text, content, reasoning):
    rng = random.Random()
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 12))))
        pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
        s, got_c, got_r = HarmonySplitter(), "", ""
        for p in pieces:
            c, r = s.feed(p)
            assert "<|" not in c or "<|" in content, (pieces, c)
            got_c, got_r = got_c + c, got_r + r
        c, r = s.finish()
        assert (got_c + c, got_r + r) == (content, reasoning), pieces


def test_one_character_at_a_time_holds_back_only_a_possible_marker():
    s = HarmonySplitter()
    shown = []
    for ch in REPLY:
        c, r = s.feed(ch)
        shown.append((c, r))
    # Content never shows a marker's first characters before it is known not to be one.
    assert "".join(c for c, _ in shown) == "2 + 2 = 4; a < b and a <| b."
    assert s.finish() == ("", "")


def test_template_detection():
    assert is_harmony_template("{{- '<|start|>assistant<|channel|>final<|message|>' }}")
    assert not is_harmony_template("{% for m in messages %}<|im_start|>{{ m['content'] }}{% endfor %}")


# ---- ember-server's chat responses (ResponseBuilder with harmony=True)

def _builder():
    from ember.server.openai_schema import parse_chat
    from ember.server.responses import ResponseBuilder
    req = parse_chat({"messages": [{"role": "user", "content": "2+2?"}]}, 1000)
    from ember.chat.reasoning import ReasoningParser
    return ResponseBuilder(req, "m", None, ["prompt"], True, None, ReasoningParser("gpt_oss"))


def _out(text, finish):
    from ember.outputs import CompletionOutput, RequestOutput
    return RequestOutput("r", None, [1, 2], None, [CompletionOutput(0, text, [5] * 3, None, None, finish)],
                         finish is not None)


def test_server_reply_has_content_and_reasoning_content():
    message = _builder().response([_out(REPLY, "stop")])["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "2 + 2 = 4; a < b and a <| b.",
                       "reasoning_content": "User asks 2+2. Easy: 4. Note <|x|> is not a marker."}


def test_server_stream_gives_deltas_of_each():
    b, rng = _builder(), random.Random()
    cuts = sorted(rng.sample(range(1, len(REPLY)), 15)) + [len(REPLY)]
    choices = [c["choices"][0] for k, n in enumerate(cuts)
               for c in b.chunks(0, _out(REPLY[:n], "stop" if k == len(cuts) - 1 else None))]
    assert "".join(c["delta"].get("content", "") for c in choices) == "2 + 2 = 4; a < b and a <| b."
    assert "".join(c["delta"].get("reasoning_content", "") for c in choices) == \
        "User asks 2+2. Easy: 4. Note <|x|> is not a marker."
    assert choices[-1]["finish_reason"] == "stop"
