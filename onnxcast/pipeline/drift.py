"""Input drift of a served model: has the data since training changed in a way the model has
not seen? A Great Expectations suite built from the training window's profile
(:func:`drift_suite`): for the target and every feature, the seasonal change
``x[t] - x[t - season]`` (a trend does not drift it, a level shift or a change of scale does);
its mean and standard deviation must lie within the range that windows of the same length had
in training, and its values within the training's extreme quantiles but for a small share.

One check for any number of series (:func:`check_drift`): one series as it is; several pooled,
each series' change divided by its training's mean absolute change (so a series of any scale
counts alike), rows in time order. pandas and great_expectations are imported inside the
functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxcast.base.errors import ConfigError
from onnxcast.pipeline.expectations import import_gx, quiet_gx, run_suite

DRIFT_SUITE = "onnxcast-drift"
DRIFT_MARGIN = 0.25  # the training range of window means/stdevs, widened by this share of its span
DRIFT_TAIL = 0.005  # values beyond the training's 0.5% / 99.5% quantiles of the change ...
DRIFT_MOSTLY = 0.9  # ... may be at most 10% of the new rows


def check_drift(columns: list[str], series: list[tuple[np.ndarray, int, np.ndarray]], season: int) -> dict:
    """The drift suite built from the training rows, run on the rows after: ``series`` holds per
    series ``(values [rows, columns], first new row, timestamps)``. Several series are pooled
    (``pooled``, and the ``series`` that had rows to check). Fewer than 2 new rows or 4 training
    rows of seasonal change: no check, and a note says so."""
    pooled = len(series) > 1
    train, new, counted = _change_rows(columns, series, season, scaled=pooled)
    head: dict[str, Any] = {"suite": DRIFT_SUITE, "season": season, **({"pooled": True} if pooled else {})}
    if len(new) < 2 or len(train) < 4:
        why = "2 new rows" if len(new) < 2 else "4 training rows of seasonal change"
        return {**head, "rows": int(len(new)), "drifted": [], "checks": [], "note": f"fewer than {why}: no drift check"}
    return {**head, **({"series": counted} if pooled else {}), **run_drift_suite(train, new, columns)}


def _change_rows(columns: list[str], series: list[tuple[np.ndarray, int, np.ndarray]], season: int, *,
                 scaled: bool):
    """(training frame, new frame, series with rows) of seasonal changes, rows in time order;
    ``scaled``: each series' change over its training's mean absolute change."""
    import pandas as pd

    train_parts, new_parts = [], []
    for values, first, stamps in series:
        values = np.asarray(values, np.float64)
        if len(values) <= season:
            continue
        change = np.full_like(values, np.nan)
        change[season:] = values[season:] - values[:-season]
        train = change[season:first]
        if len(train) < 2 and scaled:
            continue
        if scaled:
            scale = np.nanmean(np.abs(train), axis=0)
            change = change / np.where(scale > 0, scale, 1.0)
        stamps = np.asarray(stamps).astype("datetime64[ns]").astype(np.int64)
        train_parts.append((stamps[season:first], change[season:first]))
        new_parts.append((stamps[max(first, season):], change[max(first, season):]))

    def frame(parts):
        names = [change_column(c) for c in columns]
        if not parts:
            return pd.DataFrame(columns=names)
        order = np.argsort(np.concatenate([p[0] for p in parts]), kind="stable")
        return pd.DataFrame(np.concatenate([p[1] for p in parts])[order], columns=names).dropna()

    return frame(train_parts), frame(new_parts), len(new_parts)


def run_drift_suite(train, new, columns: list[str]) -> dict:
    """The drift suite of the ``train`` frame of seasonal changes, run on ``new``: the rows,
    the drifted columns (in ``columns`` order), every check and the profile."""
    import pandas as pd

    suite, profile = drift_suite(train, len(new), columns)

    with quiet_gx():
        validation = run_suite(pd.DataFrame(new), suite)
    checks = []
    for outcome in validation.results:
        config = outcome.expectation_config
        meta = config.meta or {}
        checks.append({"column": meta["column"], "check": meta["check"], "passed": bool(outcome.success),
                       "observed": _plain((outcome.result or {}).get("observed_value",
                                                                      (outcome.result or {}).get("unexpected_percent"))),
                       "expected": meta["expected"]})
    drifted = sorted({c["column"] for c in checks if not c["passed"]}, key=columns.index)
    return {"rows": int(len(new)), "training_rows": int(len(train)), "drifted": drifted, "checks": checks,
            "profile": profile}


def change_frame(values: np.ndarray, columns: list[str], season: int):
    """The seasonal change ``x[t] - x[t - season]`` of every column (NaN for the first season)."""
    import pandas as pd

    lagged = np.full_like(values, np.nan)
    lagged[season:] = values[season:] - values[:-season]
    return pd.DataFrame(lagged, columns=[change_column(c) for c in columns])


def change_column(column: str) -> str:
    return f"{column}.change"


def drift_suite(train, window: int, columns: list[str]):
    """The GX suite of the training window's profile: per column, the mean and standard
    deviation of its seasonal change within the range windows of ``window`` rows had in
    training (widened by ``DRIFT_MARGIN`` of the span), and its values within the training's
    ``DRIFT_TAIL`` quantiles for at least ``DRIFT_MOSTLY`` of the rows. Returns (suite, profile)."""
    gx = import_gx()
    E = gx.expectations
    expectations, profile = [], {}
    for column in columns:
        values = train[change_column(column)]
        if len(values) < 4:
            raise ConfigError(f"{column!r}: {len(values)} training rows of seasonal change; no profile to check against")
        size = max(2, min(window, len(values) // 2))
        rolling = values.rolling(size)
        means, stdevs = rolling.mean().dropna(), rolling.std().dropna()
        mean_range = _widened(float(means.min()), float(means.max()))
        std_range = _widened(float(stdevs.min()), float(stdevs.max()), floor=0.0)
        tails = (float(values.quantile(DRIFT_TAIL)), float(values.quantile(1 - DRIFT_TAIL)))
        profile[column] = {"window": size, "mean": mean_range, "stdev": std_range, "tails": tails}
        name = change_column(column)
        expectations += [
            E.ExpectColumnMeanToBeBetween(column=name, min_value=mean_range[0], max_value=mean_range[1],
                                          meta={"column": column, "check": "change_mean", "expected": mean_range}),
            E.ExpectColumnStdevToBeBetween(column=name, min_value=std_range[0], max_value=std_range[1],
                                           meta={"column": column, "check": "change_stdev", "expected": std_range}),
            E.ExpectColumnValuesToBeBetween(column=name, min_value=tails[0], max_value=tails[1], mostly=DRIFT_MOSTLY,
                                            meta={"column": column, "check": "change_tails",
                                                  "expected": [*tails, DRIFT_MOSTLY]}),
        ]
    return gx.ExpectationSuite(name=DRIFT_SUITE, expectations=expectations), profile


def _widened(low: float, high: float, floor: float | None = None) -> list[float]:
    span = max(high - low, 1e-12 * max(abs(low), abs(high), 1.0))
    low, high = low - DRIFT_MARGIN * span, high + DRIFT_MARGIN * span
    return [max(low, floor) if floor is not None else low, high]


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value
