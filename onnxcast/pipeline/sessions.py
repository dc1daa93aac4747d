"""ONNX Runtime sessions of the pipeline: one way to open a model and run it.

Every session is a CPU session with explicit threading: ORT's default is one thread per
physical core with spinning on, and two sessions in parallel workers then thrash each other
(ORT#3099, #10273; docs/architecture.md, "ONNX Runtime threads"). So ``intra_op_num_threads``
comes from the settings, ``inter_op_num_threads`` is 1 and spinning is off
(``session.intra_op.allow_spinning=0``, ORT#13808) unless a benchmark asks for it.
onnxruntime is imported when a session is opened, never at module import.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from onnxcast.base.batches import run_in_chunks
from onnxcast.base.contract import OUTPUT_NAME, QUANTILES_NAME
from onnxcast.base.errors import VerificationError


def onnx_session(path: str | Path, threads: int = 1, spinning: bool = False):
    """An ORT CPU session with explicit threading: parallel workers must not oversubscribe."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def open_model(path: str | Path, threads: int = 1):
    """``(session, metadata)`` of a model file that was not made in this run (a served model):
    :func:`onnx_session`, with a file ONNX Runtime cannot load reported as VerificationError."""
    try:
        session = onnx_session(path, threads)
    except Exception as exc:  # ORT raises its own types for a file it cannot load
        raise VerificationError(f"{path}: ONNX Runtime cannot load it: {' '.join(str(exc).split())[:200]}") from None
    return session, dict(session.get_modelmeta().custom_metadata_map)


def onnx_predict(session, history: np.ndarray) -> np.ndarray:
    """Forecasts for ``history [N, time, F]`` with an ORT session, in cache-sized chunks."""
    if len(history) == 0:
        return np.zeros((0, 0), np.float32)
    return run_in_chunks(session, [OUTPUT_NAME], history)[0].astype(np.float32)


def onnx_predict_with_quantiles(session, history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(forecast [N, horizon], quantiles [N, horizon, Q])`` for ``history [N, time, F]`` with an
    ORT session of a model that has the ``quantiles`` output, in cache-sized chunks."""
    forecast, quantiles = run_in_chunks(session, [OUTPUT_NAME, QUANTILES_NAME], history)
    return forecast.astype(np.float32), quantiles.astype(np.float32)
