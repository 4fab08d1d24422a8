"""ember.AsyncLLMEngine (vLLM's asyncio API) on the real SmolLM2-135M model: concurrent streams,
cumulative outputs, leaving a stream early or cancelling its task cancels the request and frees
its KV, abort(), shutdown(), and a clean exit with engines left open. Fails (never skips) while
_ember.Engine is missing."""
import asyncio
import subprocess
import sys
import time

import pytest

from ember import LLM, AsyncLLMEngine, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
LONG = SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(smollm2_path):
    with LLM(smollm2_path, n_ctx=512, max_num_seqs=8, deterministic=True) as model:
        yield model


@pytest.fixture
def engine(llm):
    engine = AsyncLLMEngine.from_llm(llm)
    yield engine
    engine.shutdown()


async def collect(engine, prompt, params, request_id=None):
    return [out async for out in engine.generate(prompt, params, request_id)]


async def wait_until(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def idle(engine):
    s = engine.stats()
    return s["running"] == 0 and s["waiting"] == 0 and s["kv_blocks_used"] == 0


def test_two_concurrent_streams(engine, llm):
    prompts = ["The capital of France is", "def fibonacci(n):"]

    async def main():
        return await asyncio.gather(*(collect(engine, p, GREEDY, f"r{i}") for i, p in enumerate(prompts)))

    streams = asyncio.run(main())
    batch = llm.generate(prompts, GREEDY, use_tqdm=False)
    for rid, stream, want in zip(("r0", "r1"), streams, batch):
        assert len(stream) > 1 and all(o.request_id == rid for o in stream)
        assert [o.finished for o in stream] == [False] * (len(stream) - 1) + [True]
        texts = [o.outputs[0].text for o in stream]
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))   # cumulative: the whole text so far
        assert stream[-1].outputs[0].token_ids == want.outputs[0].token_ids
        assert texts[-1] == want.outputs[0].text and stream[-1].outputs[0].finish_reason == "length"


def test_stop_string_in_a_stream(engine, llm):
    prompt = "The capital of France is"
    full = llm.generate(prompt, GREEDY, use_tqdm=False)[0].outputs[0].text
    stop = full[10:14]
    stream = asyncio.run(collect(engine, prompt, SamplingParams(temperature=0, max_tokens=24, stop=stop)))
    assert not any(stop in o.outputs[0].text for o in stream)
    assert stream[-1].outputs[0].text == full[:full.index(stop)] and stream[-1].outputs[0].finish_reason == "stop"


def test_leaving_a_stream_early_cancels_it(engine):
    async def main():
        other = asyncio.create_task(collect(engine, "Once upon a time", GREEDY))
        gen = engine.generate("The history of", LONG, "early")
        seen = 0
        async for out in gen:   # noqa: B007 (the last output is checked after the loop)
            seen += 1
            if seen == 3:
                break
        await gen.aclose()
        assert not out.finished and len(out.outputs[0].token_ids) < 300
        await wait_until(lambda: engine.stats()["running"] <= 1)   # at most `other` left
        finished = await other
        assert finished[-1].finished
        await wait_until(lambda: idle(engine))

        # Cancelling the task that consumes a stream cancels its request too.
        task = asyncio.create_task(collect(engine, "The history of", LONG))
        await wait_until(lambda: engine.stats()["running"] == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: idle(engine))

    asyncio.run(main())


def test_abort(engine):
    async def main():
        outputs = []
        async for out in engine.generate("The history of", LONG, "to-abort"):
            outputs.append(out)
            if len(outputs) == 2:
                engine.abort("to-abort")
        engine.abort("to-abort")   # finished: nothing happens
        engine.abort("never-was")
        await wait_until(lambda: idle(engine))
        return outputs

    outputs = asyncio.run(main())
    last = outputs[-1]
    assert last.finished and last.outputs[0].finish_reason == "abort"
    assert 0 < len(last.outputs[0].token_ids) < 300


def test_duplicate_request_id(engine):
    async def main():
        first = engine.generate("The history of", LONG, "same")
        await first.__anext__()
        with pytest.raises(ValueError, match="same"):
            await collect(engine, "Hello", GREEDY, "same")
        await first.aclose()
        await wait_until(lambda: idle(engine))

    asyncio.run(main())


def test_own_engine_and_shutdown(smollm2_path):
    engine = AsyncLLMEngine(smollm2_path, n_ctx=512, max_num_seqs=4)

    async def main():
        gen = engine.generate("The history of", LONG)
        first = await gen.__anext__()
        assert not first.finished
        engine.shutdown()   # the running request ends with "abort"
        rest = [out async for out in gen]
        assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "abort"
        with pytest.raises(RuntimeError, match="not running"):
            await collect(engine, "Hello", GREEDY)

    asyncio.run(main())
    with pytest.raises(ValueError, match="closed"):
        engine.stats()


EXIT_SCRIPT = """
import asyncio, sys
from ember import LLM, AsyncLLMEngine, SamplingParams
llm = LLM(sys.argv[1], n_ctx=256, max_num_seqs=4)
shared = AsyncLLMEngine.from_llm(llm)
own = AsyncLLMEngine(sys.argv[1], n_ctx=256, max_num_seqs=4)
async def main():
    for engine in (shared, own):
        async for out in engine.generate("Hello", SamplingParams(max_tokens=100)):
            break   # a stream left unfinished
asyncio.run(main())
llm.generate("Hi", SamplingParams(max_tokens=4), use_tqdm=False)
"""


def test_engines_left_open_exit_cleanly(smollm2_path):
    # Neither shut down nor closed: the exit must not hang, abort, or report leaked bindings.
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, smollm2_path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "leaked" not in r.stderr, r.stderr[-3000:]
