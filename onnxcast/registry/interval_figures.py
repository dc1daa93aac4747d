"""The forecast intervals as the registry sees them: the interval figures of a report (every
key optional: a report from before forecast distributions has none) and the quantiles of an
ONNX model at given histories.

Report keys (onnxcast.pipeline.intervals.interval_metrics plus ``levels``): a variant entry's
``holdout["intervals"]``, ``baselines["seasonal_naive"]["intervals"]``, ``reference["intervals"]``;
several series' aggregates also under ``report["fleet"]["families"][family][variant]["intervals"]``
and ``report["fleet"]["reference"]["aggregates"][model]["intervals"]``, and per-series columns
``<variant>.msis_95`` in the per-series tables.

numpy and onnxruntime are imported inside functions (Airflow operators import this module).
"""

from __future__ import annotations

from pathlib import Path

from onnxcast.base.contract import (
    METADATA_PREFIX,
    QUANTILE_METADATA,
    QUANTILES_NAME,
    central_intervals,
    parse_quantile_levels,
)

# the figures worth a metric (``levels`` is a list, ``width_*`` follow from the rest)
METRIC_KEYS = ("coverage_80", "coverage_95", "width_80", "width_95", "msis_80", "msis_95", "pinball", "crossing")
# what the champion/challenger decision on "msis" compares: the 95% interval's score
MSIS_KEY = "msis_95"
NOMINAL = 0.95


def variant_intervals(entry: dict | None, variant: str = "fp32") -> dict:
    """The interval figures of ``variant`` in a family's report entry or validation.json
    (``variants[*].holdout.intervals``); empty when it has none."""
    for row in (entry or {}).get("variants") or []:
        if row.get("name") == variant:
            return dict(((row.get("holdout") or {}).get("intervals")) or {})
    return {}


def family_intervals(report: dict, family: str, variant: str = "fp32") -> dict:
    """A family's interval figures in a report of any number of series: the means over series
    of the report's ``fleet`` block when it has them, else the variant entry's ``holdout.intervals``."""
    block = ((((report.get("fleet") or {}).get("families") or {}).get(family) or {}).get(variant) or {})
    if block.get("intervals"):
        return dict(block["intervals"])
    return variant_intervals(next((m for m in report.get("models", []) if m.get("family") == family), None), variant)


def numbers(intervals: dict) -> dict[str, float]:
    """The figures of :data:`METRIC_KEYS` that are numbers (nan included: the caller drops it)."""
    return {k: float(intervals[k]) for k in METRIC_KEYS
            if isinstance(intervals.get(k), int | float) and not isinstance(intervals.get(k), bool)}


def forecast_and_quantiles(path: str | Path, history):
    """``(forecast [N, horizon], quantiles [N, horizon, Q] or None, levels or None)`` of the ONNX
    model at ``path`` for ``history [N, time, F]``; no quantiles when the model has no such
    output (a model exported before forecast distributions)."""
    import numpy as np

    from onnxcast.base.batches import run_in_chunks
    from onnxcast.pipeline.sessions import onnx_session

    session = onnx_session(path, threads=1)
    names = [o.name for o in session.get_outputs()]
    history = np.ascontiguousarray(history, dtype=np.float32)
    if QUANTILES_NAME not in names:
        return run_in_chunks(session, ["forecast"], history)[0], None, None
    meta = session.get_modelmeta().custom_metadata_map
    levels = parse_quantile_levels(meta[METADATA_PREFIX + QUANTILE_METADATA], f"{path}: {QUANTILE_METADATA}")
    forecast, quantiles = run_in_chunks(session, ["forecast", QUANTILES_NAME], history)
    return forecast, quantiles, levels


def band(quantiles, levels, nominal: float):
    """``(low, high)`` of the central ``nominal`` interval (0.8, 0.95) in ``quantiles [..., Q]``,
    or None when the levels hold no such pair."""
    for lo, hi, got in central_intervals(levels):
        if abs(got - nominal) < 1e-9:
            return quantiles[..., lo], quantiles[..., hi]
    return None


def per_origin_msis(path: str | Path, history, actual, scale: float):
    """The 95% interval's scaled interval score of each origin (mean over the horizon), the
    per-origin numbers a paired test needs; ``(scores, None)`` or ``(None, why not)``."""
    import numpy as np

    from onnxcast.pipeline.intervals import interval_score

    _, quantiles, levels = forecast_and_quantiles(path, history)
    if quantiles is None:
        return None, f"{Path(path).name} of {Path(path).parent.parent.name} has no quantiles output"
    interval = band(quantiles, levels, NOMINAL)
    if interval is None:
        return None, f"{Path(path).parent.parent.name}'s quantile levels {list(levels)} hold no 95% interval"
    scores = interval_score(actual, interval[0], interval[1], 1.0 - NOMINAL).mean(axis=1) / (scale or 1.0)
    return np.asarray(scores, np.float64), None
