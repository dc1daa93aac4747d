"""Load a time series, split it by time and cut sliding windows.

``series_from_checked`` turns the rows the data-quality gate passed (onnxcast.pipeline.quality) into a
float32 matrix ``[rows, 1 + n_features]`` (target first) on a regular time grid;
``split_by_time`` fixes train / validation / holdout boundaries;
``windows`` cuts ``(history, target)`` pairs for training and evaluation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from onnxcast.base.errors import DataError
from onnxcast.base.files import write_text_atomic
from onnxcast.pipeline.config import PipelineConfig


@dataclass
class SeriesData:
    """A validated, regular series. ``values[:, 0]`` is the target."""

    values: np.ndarray  # float32 [rows, n_features]
    timestamps: np.ndarray  # datetime64[ns], UTC, strictly increasing, regular
    columns: tuple[str, ...]  # target first, then features
    freq: str
    season: int
    source: str
    sha256: str

    @property
    def target(self) -> np.ndarray:
        return self.values[:, 0]

    def save(self, directory: str | Path) -> None:
        """Write the series for later pipeline steps (``series.npz`` + ``series.json``)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        np.savez(directory / "series.npz", values=self.values,
                 timestamps=self.timestamps.astype("datetime64[ns]").astype("int64"))
        meta = {"columns": list(self.columns), "freq": self.freq, "season": self.season,
                "source": self.source, "sha256": self.sha256}
        write_text_atomic(directory / "series.json", json.dumps(meta, indent=2))

    @classmethod
    def load(cls, directory: str | Path) -> SeriesData:
        directory = Path(directory)
        arrays = np.load(directory / "series.npz")
        meta = json.loads((directory / "series.json").read_text())
        return cls(values=arrays["values"], timestamps=arrays["timestamps"].astype("datetime64[ns]"),
                   columns=tuple(meta["columns"]), freq=meta["freq"], season=meta["season"],
                   source=meta["source"], sha256=meta["sha256"])


@dataclass(frozen=True)
class Split:
    """Row boundaries: train ``[0, train_end)``, validation ``[train_end, validation_end)``,
    holdout ``[validation_end, rows)``. Windows may look back across a boundary."""

    rows: int
    train_end: int
    validation_end: int

    def as_dict(self, timestamps: np.ndarray) -> dict:
        def ts(i: int) -> str:
            return utc_iso(timestamps[i])

        return {
            "train_end": ts(self.train_end - 1),
            "validation_end": ts(self.validation_end - 1),
            "holdout_start": ts(self.validation_end),
            "holdout_end": ts(self.rows - 1),
            "rows": self.rows,
            "train_rows": self.train_end,
            "validation_rows": self.validation_end - self.train_end,
            "holdout_rows": self.rows - self.validation_end,
        }


def series_from_checked(times, values: dict, freq: str, season: int, *, fill_gaps_max_steps: int = 0,
                        source: str, sha256: str) -> SeriesData:
    """The regular series of rows the data-quality gate (onnxcast.pipeline.quality) has passed.

    A pure transform, not a second validator: ``times`` are the parsed UTC timestamps of the
    rows in use (``trained_until`` applied), ``values`` the numeric columns, target first, on
    the same index. Keeps the last of duplicate timestamps (the gate refuses duplicates unless
    that repair was asked for), orders by time, lays the rows on the ``freq`` grid and
    interpolates gaps of up to ``fill_gaps_max_steps`` (the gate refuses longer ones).
    """
    import pandas as pd

    index = pd.DatetimeIndex(times)
    index = index.tz_localize("UTC") if index.tz is None else index.tz_convert("UTC")
    table = pd.DataFrame({name: column.to_numpy(dtype="float64") for name, column in values.items()},
                         index=index)
    table = table[~table.index.duplicated(keep="last")].sort_index()
    grid = pd.date_range(table.index[0], table.index[-1], freq=freq)
    table = fill_short_gaps(table.reindex(grid), fill_gaps_max_steps)
    array = table.to_numpy(dtype="float32")
    if not np.isfinite(array).all():  # the gate's checks promise this never happens
        first = table.index[~np.isfinite(array).all(axis=1)][0]
        raise DataError(f"{source}: no finite value at {_iso(first)} after the data checks passed; "
                        "please report this with the file")
    return SeriesData(values=array, timestamps=table.index.tz_localize(None).to_numpy().astype("datetime64[ns]"),
                      columns=tuple(values), freq=freq, season=season, source=source, sha256=sha256)


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


def split_by_time(n_rows: int, cfg: PipelineConfig) -> Split:
    """Time-ordered split; the holdout holds at least ``min_holdout_windows`` full horizons."""
    holdout = max(int(round(n_rows * cfg.holdout_fraction)), cfg.horizon * cfg.quality.min_holdout_windows)
    validation = max(int(round(n_rows * cfg.validation_fraction)), cfg.horizon * 2)
    train_end = n_rows - holdout - validation
    needed = cfg.lookback + cfg.horizon + cfg.horizon  # at least a couple of training windows
    if train_end < needed:
        raise DataError(
            f"{n_rows} rows are too few for lookback {cfg.lookback} + horizon {cfg.horizon}: "
            f"need at least {needed + holdout + validation}"
        )
    return Split(rows=n_rows, train_end=train_end, validation_end=train_end + validation)


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


def _iso(value) -> str:
    import pandas as pd

    return pd.Timestamp(value).isoformat()
