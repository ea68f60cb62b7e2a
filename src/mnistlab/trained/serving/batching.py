"""Dynamic batching for the server: the inputs of requests that arrive together go through the model in
one call, on a thread of its own, while the event loop goes on reading requests.

A batch starts as soon as the model is free and holds whatever has arrived, up to ``max_batch_size``;
``batch_timeout`` > 0 makes a batch wait that long for more first. Under load the next batch fills while
the model runs the current one, so waiting adds latency without adding throughput (measured in
benchmarks/serving.py): the default is 0.
"""

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class Batcher:
    def __init__(self, work: Callable[[list[Any]], list[Any]], max_batch_size: int, batch_timeout: float) -> None:
        """``work``: a batch of items -> a result for each, in order (run on the model's thread)."""
        self.work, self.max_batch_size, self.batch_timeout = work, max_batch_size, batch_timeout
        self._waiting: list[tuple[Any, asyncio.Future]] = []
        self._arrived = asyncio.Event()
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="model")  # one model call at a time

    async def submit(self, items: list[Any]) -> list[Any]:
        """The result of each of ``items``, once the batches that hold them have run."""
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in items]
        self._waiting.extend(zip(items, futures, strict=True))
        self._arrived.set()
        return list(await asyncio.gather(*futures))

    async def run(self) -> None:
        """Run batches for as long as the server runs (a task of its event loop)."""
        while True:
            await self._arrived.wait()
            await self._fill()
            self._arrived.clear()  # what arrives from now on is found by the loop below, or wakes the next wait
            while self._waiting:
                batch, self._waiting = self._waiting[: self.max_batch_size], self._waiting[self.max_batch_size :]
                await self._run(batch)

    async def _fill(self) -> None:
        """Wait up to ``batch_timeout`` for a full batch."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.batch_timeout
        while len(self._waiting) < self.max_batch_size and (left := deadline - loop.time()) > 0:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    async def _run(self, batch: list[tuple[Any, asyncio.Future]]) -> None:
        loop = asyncio.get_running_loop()
        futures = [future for _, future in batch]  # a future is done early when its client went away
        try:
            results = await loop.run_in_executor(self._model_thread, self.work, [item for item, _ in batch])
        except Exception as err:  # noqa: BLE001 -- a fault of the model: every request of the batch gets it
            for future in futures:
                if not future.done():
                    future.set_exception(err)
            return
        for future, result in zip(futures, results, strict=True):
            if not future.done():
                future.set_result(result)
