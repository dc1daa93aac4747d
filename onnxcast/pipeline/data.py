"""Time helpers of a checked series and its sliding windows.

The data gate (onnxcast.pipeline.fleet_quality) lays the series it keeps on their time grid
(:class:`onnxcast.pipeline.fleet_data.FleetData`, split by ``split_fleet``); ``windows`` cuts
``(history, target)`` pairs for training and evaluation.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from onnxcast.base.errors import DataError
from onnxcast.pipeline.fleet_data import FleetSplit


def infer_freq(index, source: str, name: str) -> str:
    """The pandas frequency of ``index``: inferred, else the most common step."""
    import pandas as pd

    freq = pd.infer_freq(index[: min(len(index), 500)]) if len(index) >= 3 else None
    if freq:
        return freq
    steps = pd.Series(np.diff(index.as_unit("ns").asi8))  # asi8 is in the index unit (us in pandas 3)
    step = pd.Timedelta(int(steps.mode().iloc[0]))
    if step <= pd.Timedelta(0):
        raise DataError(f"{source}: cannot infer a frequency from column {name!r}")
    return pd.tseries.frequencies.to_offset(step).freqstr


def windows(values: np.ndarray, lookback: int, horizon: int, start: int, end: int,
            stride: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sliding windows whose forecast steps fall in ``[start, end)``.

    Returns ``history [N, lookback, F]``, ``target [N, horizon]`` and the origins
    (index of each window's first forecast step).
    """
    first = max(start, lookback)
    origins = np.arange(first, end - horizon + 1, stride)
    if len(origins) == 0:
        return (np.zeros((0, lookback, values.shape[1]), np.float32), np.zeros((0, horizon), np.float32), origins)
    view = np.lib.stride_tricks.sliding_window_view(values, lookback, axis=0)  # [rows-lookback+1, F, lookback]
    history = view[origins - lookback].transpose(0, 2, 1)
    target_view = np.lib.stride_tricks.sliding_window_view(values[:, 0], horizon)
    target = target_view[origins]
    return np.ascontiguousarray(history, np.float32), np.ascontiguousarray(target, np.float32), origins


def dated_split(split: FleetSplit, timestamps: np.ndarray) -> dict:
    """The split of one series (series 0, on ``timestamps``) as dates and row counts: the
    report's ``split`` of a run judged over its origins."""
    rows, train_end, validation_end = int(split.lengths[0]), int(split.train_end[0]), int(split.validation_end[0])
    return {
        "train_end": utc_iso(timestamps[train_end - 1]),
        "validation_end": utc_iso(timestamps[validation_end - 1]),
        "holdout_start": utc_iso(timestamps[validation_end]),
        "holdout_end": utc_iso(timestamps[rows - 1]),
        "rows": rows,
        "train_rows": train_end,
        "validation_rows": validation_end - train_end,
        "holdout_rows": rows - validation_end,
    }


def fill_short_gaps(table, max_steps: int):
    """``table`` (on its time grid) with runs of at most ``max_steps`` missing rows interpolated in time."""
    if max_steps <= 0:
        return table
    return table.interpolate(method="time", limit=max_steps, limit_area="inside")


def utc_iso(value) -> str:
    """A UTC timestamp (naive datetime64 values are UTC here) as ``YYYY-MM-DDTHH:MM:SSZ``:
    the one format of every timestamp in report.json and the ONNX metadata."""
    return str(np.datetime_as_string(np.datetime64(value, "s"))) + "Z"


def parse_utc(text: str) -> np.datetime64:
    """An ISO 8601 timestamp (``Z`` or an offset: converted; none: taken as UTC) as the naive
    ``datetime64[ns]`` in UTC that series timestamps are."""
    moment = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC).replace(tzinfo=None)
    return np.datetime64(moment, "ns")
