"""The checked series of a run, one or many, their split and their shards.

One representation for any number of series: a single series is a fleet of one
(:meth:`FleetData.one`), split, windowed and anchored by the same functions as a fleet.

A fleet is kept ragged, series back to back in one float32 array with offsets (a CSR
layout), never as a padded matrix: M3 monthly series are 66 to 144 points long, and a
10,000-series fleet of 1,000 points is 40 MB this way. Timestamps are not stored per point:
after the data gate every series lies on the fleet's one regular grid, so its first timestamp
and the frequency give the rest.

Every series is split from its own end (the competitions' protocol: the test period of a
series is its last points), so its holdout is its most recent data whatever its length. How
long that holdout is follows how the run is judged (``judging.judging_for``): one series
is judged by statistics over many dependent holdout origins, so it holds out a share of its
rows (``holdout_fraction``); many series are judged across series, one horizon each.
Shards group series for the per-series work that runs in parallel (data checks, the
statistical reference, the per-series evaluation): one mapped Airflow task per shard.

numpy only at import time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxcast.base.errors import DataError
from onnxcast.base.files import write_text_atomic
from onnxcast.pipeline.judging import ACROSS_SERIES, OVER_ORIGINS, judging_for  # noqa: F401  (ACROSS_SERIES: read

# from here by airflow/steps.py too)

FLEET_JSON = "fleet.json"
ARRAYS = ("values", "offsets", "starts")


@dataclass
class FleetData:
    """Checked, regular series of one frequency, back to back. ``values[:, 0]`` is the target."""

    values: np.ndarray  # float32 [total_rows, n_features]; series i is values[offsets[i]:offsets[i + 1]]
    offsets: np.ndarray  # int64 [n_series + 1]
    starts: np.ndarray  # int64 [n_series]: first timestamp, ns since the epoch, UTC
    ids: tuple[str, ...]  # series ids, sorted, unique
    columns: tuple[str, ...]  # target first, then features
    freq: str
    season: int
    source: str
    sha256: str

    def __post_init__(self) -> None:
        n = len(self.ids)
        if self.offsets.shape != (n + 1,) or self.starts.shape != (n,):
            raise ValueError(f"fleet of {n} series with {len(self.offsets)} offsets and {len(self.starts)} starts")
        if n and (self.offsets[0] != 0 or self.offsets[-1] != len(self.values)):
            raise ValueError("offsets do not cover the values")

    @classmethod
    def one(cls, values: np.ndarray, timestamps: np.ndarray, *, series_id: str, columns: tuple[str, ...], freq: str,
            season: int, source: str, sha256: str) -> FleetData:
        """A single regular series (``values [rows, n_features]`` on ``timestamps``, naive UTC
        datetime64 on the ``freq`` grid) as a fleet of one."""
        values = np.ascontiguousarray(values, dtype=np.float32)
        start = np.asarray(timestamps[:1]).astype("datetime64[ns]").astype(np.int64)
        return cls(values=values, offsets=np.array([0, len(values)], dtype=np.int64), starts=start,
                   ids=(series_id,), columns=tuple(columns), freq=freq, season=int(season), source=source,
                   sha256=sha256)

    @property
    def n_series(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def n_features(self) -> int:
        return int(self.values.shape[1])

    def series(self, i: int) -> np.ndarray:
        """Series ``i``, a view ``[length, n_features]``."""
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    def target(self, i: int) -> np.ndarray:
        return self.values[self.offsets[i] : self.offsets[i + 1], 0]

    def timestamps(self, i: int) -> np.ndarray:
        """The timestamps of series ``i`` (datetime64[ns], UTC, naive)."""
        import pandas as pd

        index = pd.date_range(pd.Timestamp(int(self.starts[i]), unit="ns"), periods=int(self.lengths[i]),
                              freq=self.freq)
        return index.to_numpy().astype("datetime64[ns]")

    def end(self, i: int) -> np.datetime64:
        return self.timestamps(i)[-1]

    def index_of(self) -> dict[str, int]:
        return {sid: i for i, sid in enumerate(self.ids)}

    def subset(self, index) -> FleetData:
        """The series at ``index`` (sorted positions), copied."""
        index = np.sort(np.asarray(index, dtype=np.int64))
        lengths = self.lengths[index]
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        parts = [self.values[self.offsets[i] : self.offsets[i + 1]] for i in index]
        values = np.concatenate(parts) if parts else np.zeros((0, self.values.shape[1]), np.float32)
        return FleetData(values=np.ascontiguousarray(values, dtype=np.float32), offsets=offsets,
                         starts=self.starts[index].copy(), ids=tuple(self.ids[i] for i in index),
                         columns=self.columns, freq=self.freq, season=self.season, source=self.source,
                         sha256=self.sha256)

    def save(self, directory: str | Path) -> None:
        """``values.npy``, ``offsets.npy``, ``starts.npy`` (memory-mappable) and ``fleet.json``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in ARRAYS:
            tmp = directory / f".{name}.npy.tmp"
            with open(tmp, "wb") as handle:
                np.save(handle, getattr(self, name), allow_pickle=False)
            tmp.replace(directory / f"{name}.npy")
        meta = {"ids": list(self.ids), "columns": list(self.columns), "freq": self.freq, "season": self.season,
                "source": self.source, "sha256": self.sha256, "n_series": self.n_series,
                "rows": int(len(self.values))}
        write_text_atomic(directory / FLEET_JSON, json.dumps(meta))

    @classmethod
    def load(cls, directory: str | Path, *, mmap: bool = False) -> FleetData:
        directory = Path(directory)
        try:
            meta = json.loads((directory / FLEET_JSON).read_text())
            arrays = {name: np.load(directory / f"{name}.npy", mmap_mode="r" if mmap else None, allow_pickle=False)
                      for name in ARRAYS}
        except (OSError, ValueError) as error:
            raise DataError(f"{directory}: not a saved fleet ({error})") from None
        return cls(values=arrays["values"], offsets=np.asarray(arrays["offsets"], dtype=np.int64),
                   starts=np.asarray(arrays["starts"], dtype=np.int64), ids=tuple(meta["ids"]),
                   columns=tuple(meta["columns"]), freq=meta["freq"], season=int(meta["season"]),
                   source=meta["source"], sha256=meta["sha256"])

    @classmethod
    def concat(cls, parts: list[FleetData]) -> FleetData:
        """The series of every part, sorted by id (the shards of one fleet)."""
        parts = [p for p in parts if p.n_series]
        if not parts:
            raise DataError("no series left in the fleet")
        first = parts[0]
        ids = [sid for p in parts for sid in p.ids]
        if len(set(ids)) != len(ids):
            raise ValueError("a series id is in more than one part")
        values = np.concatenate([np.asarray(p.values) for p in parts])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + base for p, base in
                                          zip(parts, np.cumsum([0] + [len(p.values) for p in parts[:-1]]),
                                              strict=True)]).astype(np.int64)
        starts = np.concatenate([p.starts for p in parts])
        merged = cls(values=values, offsets=offsets, starts=starts, ids=tuple(ids), columns=first.columns,
                     freq=first.freq, season=first.season, source=first.source, sha256=first.sha256)
        order = np.argsort(np.asarray(ids, dtype=object), kind="stable")
        return merged if np.all(order == np.arange(len(ids))) else merged.subset_in_order(order)

    def subset_in_order(self, order) -> FleetData:
        """The series in the order ``order`` (a permutation), copied."""
        order = np.asarray(order, dtype=np.int64)
        lengths = self.lengths[order]
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate([self.values[self.offsets[i] : self.offsets[i + 1]] for i in order])
        return FleetData(values=values, offsets=offsets, starts=self.starts[order].copy(),
                         ids=tuple(self.ids[i] for i in order), columns=self.columns, freq=self.freq,
                         season=self.season, source=self.source, sha256=self.sha256)


@dataclass(frozen=True)
class FleetSplit:
    """Every series split from its own end: train ``[0, train_end)``, validation
    ``[train_end, validation_end)``, holdout ``[validation_end, length)``, per series."""

    lengths: np.ndarray  # int64 [n_series]
    train_end: np.ndarray  # int64 [n_series]
    validation_end: np.ndarray  # int64 [n_series]
    holdout_steps: int
    validation_steps: int

    def as_dict(self) -> dict:
        def spread(a: np.ndarray) -> dict:
            return {"min": int(a.min()), "median": float(np.median(a)), "max": int(a.max())}

        return {"per_series": True, "holdout_steps": self.holdout_steps, "validation_steps": self.validation_steps,
                "rows": int(self.lengths.sum()), "train_rows": int(self.train_end.sum()),
                "validation_rows": int((self.validation_end - self.train_end).sum()),
                "holdout_rows": int((self.lengths - self.validation_end).sum()),
                "lengths": spread(self.lengths), "train_steps": spread(self.train_end)}


def fleet_steps(cfg) -> tuple[int, int]:
    """(holdout steps, validation steps) of every series judged across series:
    ``min_holdout_windows`` horizons held out (1: exactly the competitions' test period), one
    horizon of validation."""
    return cfg.horizon * cfg.quality.min_holdout_windows, cfg.horizon


def split_fleet(lengths: np.ndarray, cfg, *, judging: str | None = None) -> FleetSplit:
    """The end-aligned split of series of ``lengths``.

    Judged across series (``judging.judging_for``): :func:`fleet_steps` for every series;
    a series may end up with a short (or empty) training segment, which the data gate excludes
    (``train_too_short``). Judged over origins (one series): ``holdout_fraction`` of the rows,
    at least ``min_holdout_windows`` horizons, and ``validation_fraction``, at least two
    horizons; DataError when too few rows are left to train on. ``judging`` overrides the
    sample's choice where another sample decided it (the monitor reading a deployed global
    model's new data: across series, however few series came)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (judging or judging_for(len(lengths))) == OVER_ORIGINS:
        holdout, validation = _proportional_steps(int(lengths[0]), cfg)
    else:
        holdout, validation = fleet_steps(cfg)
    validation_end = lengths - holdout
    return FleetSplit(lengths=lengths, train_end=validation_end - validation, validation_end=validation_end,
                      holdout_steps=holdout, validation_steps=validation)


def proportional_steps(n_rows: int, cfg) -> tuple[int, int]:
    """(holdout, validation) steps of one series of ``n_rows`` judged over its origins, however
    short: ``holdout_fraction`` of the rows, at least ``min_holdout_windows`` full horizons, and
    ``validation_fraction``, at least two horizons."""
    holdout = max(int(round(n_rows * cfg.holdout_fraction)), cfg.horizon * cfg.quality.min_holdout_windows)
    return holdout, max(int(round(n_rows * cfg.validation_fraction)), cfg.horizon * 2)


def train_steps_over_origins(cfg) -> int:
    """Training steps one series judged over its origins needs: a couple of training windows."""
    return cfg.lookback + cfg.horizon + cfg.horizon


def min_rows_over_origins(cfg) -> int:
    """Fewest rows one series judged over its origins needs for its split."""
    n = train_steps_over_origins(cfg)
    while n - sum(proportional_steps(n, cfg)) < train_steps_over_origins(cfg):
        n += 1
    return n


def _proportional_steps(n_rows: int, cfg) -> tuple[int, int]:
    """:func:`proportional_steps`; DataError when too few rows are left to train on."""
    holdout, validation = proportional_steps(n_rows, cfg)
    train_end = n_rows - holdout - validation
    needed = train_steps_over_origins(cfg)
    if train_end < needed:
        raise DataError(
            f"{n_rows} rows are too few for lookback {cfg.lookback} + horizon {cfg.horizon}: "
            f"need at least {needed + holdout + validation}"
        )
    return holdout, validation


def load_split(directory: str | Path, cfg, *, mmap: bool = False) -> tuple[FleetData, FleetSplit]:
    """The series saved in ``directory`` (``RunLayout.fleet``) and their split under ``cfg``."""
    data = load_saved(directory, mmap=mmap)
    return data, split_fleet(data.lengths, cfg)


# A one-series run before issue 31 saved its series as data/series.npz + data/series.json
OLD_SERIES_NPZ, OLD_SERIES_JSON = "series.npz", "series.json"


def load_saved(directory: str | Path, *, mmap: bool = False) -> FleetData:
    """The series saved in ``directory`` (``RunLayout.fleet``); for a one-series run directory
    written before issue 31, which has no ``data/fleet/`` but ``data/series.npz`` beside it, that
    series as a fleet of one (its id the first column, the target), so that the readers of a
    finished run (tracking's plot, champion/challenger's MSIS fallback) still read it."""
    directory = Path(directory)
    old = directory.parent / OLD_SERIES_NPZ
    if (directory / FLEET_JSON).exists() or not old.exists():
        return FleetData.load(directory, mmap=mmap)
    try:
        arrays = np.load(old, allow_pickle=False)
        meta = json.loads((directory.parent / OLD_SERIES_JSON).read_text())
        return FleetData.one(arrays["values"], arrays["timestamps"].astype("datetime64[ns]"),
                             series_id=meta["columns"][0], columns=tuple(meta["columns"]), freq=meta["freq"],
                             season=int(meta["season"]), source=meta["source"], sha256=meta["sha256"])
    except (OSError, ValueError, KeyError) as error:
        raise DataError(f"{old}: not a saved series of an older run ({error})") from None


def min_train_steps(cfg, season: int) -> int:
    """Training steps a series needs: ``quality.min_train_steps``, else one season (at least 2).

    A season of history is what the seasonal anchor reads; shorter histories are edge-padded.
    A series whose training segment holds no whole training window (fewer than a season plus
    the horizon) still counts: it is forecast and judged from its own history, and trains
    nothing. "A season plus the horizon" refused 139 of M1 monthly's 617 series (22.5%)."""
    if cfg.quality.min_train_steps is not None:
        return int(cfg.quality.min_train_steps)
    return max(season, 2)


def assign_shards(lengths: np.ndarray, n_shards: int) -> list[np.ndarray]:
    """Series positions per shard, balanced on rows (longest first onto the lightest shard);
    deterministic; every shard sorted; never more shards than series, never fewer than one."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = max(1, min(int(n_shards), len(lengths)))
    load = np.zeros(n, dtype=np.int64)
    members: list[list[int]] = [[] for _ in range(n)]
    for i in np.argsort(-lengths, kind="stable"):
        k = int(np.argmin(load))
        members[k].append(int(i))
        load[k] += lengths[i]
    return [np.array(sorted(m), dtype=np.int64) for m in members]
