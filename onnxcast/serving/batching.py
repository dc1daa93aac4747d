"""Adaptive batching: concurrent requests become one ONNX Runtime call.

Requests wait in a queue once their body is read and decoded: a batch is formed only from
such fully-parsed requests, never held for a body still in flight (one client that sent
headers and half a body used to add the whole ``max_delay`` to every other request). The
batcher takes the first one and, while the queue keeps growing (requests whose bodies were
already received are being decoded on the event loop) and the batch is below
``max_batch_size`` histories, lets them queue, up to ``max_delay`` seconds after the first;
a lone client is never delayed. Requests with different history lengths go to different
calls (one tensor per call).
While a batch runs in the inference thread, the next one fills up, so batches grow with
load. Every request in a batch is answered by the same model version, with every output of
the model (``forecast``, and ``quantiles`` when it has one) cut to its rows.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from onnxcast.serving.model import ServedModel

INLINE_ROWS = 4  # a lone small request runs on the event loop; batches run in the inference thread


class NotReadyError(RuntimeError):
    """No verified model is loaded yet."""


@dataclass
class _Pending:
    history: np.ndarray
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)


class Batcher:
    """Coalesces ``submit`` calls; ``model`` returns the model to run a batch with (read once
    per batch). ``observe(rows, requests, version)`` is called after each batch."""

    def __init__(self, model: Callable[[], ServedModel | None], *, max_batch_size: int = 64,
                 max_delay: float = 0.005, observe: Callable[[int, int, str], None] | None = None):
        self._model, self.max_batch_size, self.max_delay = model, max_batch_size, max_delay
        self._observe = observe
        self._queue: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="inference")
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        """Finish what is queued, then stop."""
        while self._queue:
            await asyncio.sleep(0.005)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=True)

    async def submit(self, history: np.ndarray) -> tuple[dict[str, np.ndarray], str]:
        """The model's outputs by name for ``history [batch, time, features]`` and the version
        that made them."""
        if self._model() is None:
            raise NotReadyError("no verified model is loaded yet")
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(history, future))
        self._wakeup.set()
        return await future

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            first = self._queue[0]
            deadline = first.enqueued + self.max_delay
            while self._rows(first.history.shape[1]) < self.max_batch_size and time.perf_counter() < deadline:
                queued = len(self._queue)
                await asyncio.sleep(0)  # requests whose bodies are in already get decoded and queued
                if len(self._queue) == queued:
                    break  # nobody else is ready: do not wait for bodies still on the wire
            batch = self._take(first.history.shape[1])
            model = self._model()
            loop = asyncio.get_running_loop()
            try:
                if model is None:
                    raise NotReadyError("no verified model is loaded yet")
                histories = [p.history for p in batch]
                stacked = histories[0] if len(histories) == 1 else np.concatenate(histories)
                if len(stacked) <= INLINE_ROWS and not self._queue:
                    outputs = model.run_outputs(stacked)  # alone: handing over to a thread costs more than it saves
                else:
                    outputs = await loop.run_in_executor(self._executor, model.run_outputs, stacked)
            except Exception as exc:  # answer every waiting request; the loop must go on
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
                continue
            start = 0
            for pending in batch:
                rows = len(pending.history)
                if not pending.future.done():  # a client may have gone away
                    pending.future.set_result(({name: values[start:start + rows] for name, values in outputs.items()},
                                               model.version))
                start += rows
            if self._observe:
                self._observe(start, len(batch), model.version)

    def _rows(self, steps: int) -> int:
        return sum(len(p.history) for p in self._queue if p.history.shape[1] == steps)

    def _take(self, steps: int) -> list[_Pending]:
        """Queued requests of ``steps`` history length, in order, up to the batch size (at least one)."""
        taken, kept, rows = [], deque(), 0
        while self._queue:
            pending = self._queue.popleft()
            size = len(pending.history)
            if pending.history.shape[1] == steps and (not taken or rows + size <= self.max_batch_size):
                taken.append(pending)
                rows += size
            else:
                kept.append(pending)
        self._queue.extendleft(reversed(kept))
        return taken
