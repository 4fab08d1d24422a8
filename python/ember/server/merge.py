"""One async stream of several requests' outputs: a /v1/completions request with several prompts
runs one engine request per prompt, and its response follows all of them at once."""
from __future__ import annotations

import asyncio
from typing import AsyncGenerator, AsyncIterator, Dict, List, Tuple

from ..outputs import RequestOutput

Stream = AsyncGenerator[RequestOutput, None]   # what AsyncLLMEngine.generate returns


async def newest_outputs(streams: List[Stream]) -> AsyncIterator[Tuple[int, RequestOutput]]:
    """Yields (i, output of streams[i]) as outputs arrive, until every stream has ended. Outputs
    are cumulative, so only the newest of each stream waits to be read (an older one replaced
    before the reader came loses nothing). A stream's error is raised here at once. Closing this
    generator (or cancelling its reader) cancels what still runs, and so the engine requests."""
    if len(streams) == 1:   # the common case needs no task of its own
        try:
            async for out in streams[0]:
                yield 0, out
        finally:
            await streams[0].aclose()
        return
    newest: Dict[int, RequestOutput] = {}
    arrived = asyncio.Event()

    async def drain(i: int, stream: Stream) -> None:
        try:
            async for out in stream:
                newest[i] = out
                arrived.set()
        finally:   # wakes the reader to see the end (or the error) too
            arrived.set()

    tasks = [asyncio.ensure_future(drain(i, s)) for i, s in enumerate(streams)]
    try:
        while True:
            while newest:
                i = next(iter(newest))
                yield i, newest.pop(i)
            failed = next((t for t in tasks if t.done() and not t.cancelled() and t.exception()), None)
            if failed is not None:
                raise failed.exception()
            if all(t.done() for t in tasks):
                return
            arrived.clear()
            await arrived.wait()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
