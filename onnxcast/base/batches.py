"""Running a model on many histories: in chunks whose activations stay in the CPU's cache.

One ONNX Runtime call on 1,024 histories wrote every intermediate tensor for all of them before
the next op read it back: at lookback 168 a Transformer layer's activations are 6 MB a tensor,
three times this machine's 2 MB of L2 a core, and the call ran slower per forecast than at batch
64. The same 1,024 histories in calls of 128 rows (one thread, same run, docs/performance.md):
LSTM 51.7 -> 35.9 ms, Transformer 105.8 -> 70.0 ms, N-HiTS int8 7.0 -> 6.3 ms, DLinear 0.57 ->
0.57 ms. Every consumer that forecasts a fleet (the device client, the V2 server, validation,
the monitor) runs its histories through :func:`run_in_chunks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxcast.base.contract import INPUT_NAME

CHUNK_ROWS = 128


def run_in_chunks(session: Any, outputs: Sequence[str], history: np.ndarray,
                  rows: int = CHUNK_ROWS) -> list[np.ndarray]:
    """``session.run(outputs, {"history": history})``, ``rows`` histories a call, the outputs
    concatenated along the batch axis: the same numbers as one call."""
    if len(history) <= rows:
        return session.run(list(outputs), {INPUT_NAME: history})
    parts = [session.run(list(outputs), {INPUT_NAME: history[start : start + rows]})
             for start in range(0, len(history), rows)]
    return [np.concatenate([part[i] for part in parts]) for i in range(len(outputs))]
