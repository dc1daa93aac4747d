"""When a difference is more than noise: paired tests and bootstrap intervals, in one place.

- **Over origins** (one series): two forecasters are compared by a Diebold-Mariano test on
  their per-origin errors (Newey-West variance over ``block - 1`` lags, since the windows of
  neighbouring origins overlap; Harvey-Leybourne-Newbold correction), and a mean of per-origin
  figures gets a moving-block bootstrap interval (:func:`block_bootstrap_interval`).
- **Across series** (a fleet): series are the independent units: the same test with block 1
  on per-series figures, pairs where either side is not finite left out
  (:func:`paired_across_series`), and a plain bootstrap over series (:func:`bootstrap_interval`).

Which of the two a comparison takes is chosen by the sample, not by a mode:
:func:`judged_across_series` (the monitor's degradation test and the champion decision both
ask it), and :func:`paired_comparison` runs the paired test it chooses.

With fewer than ``MIN_PAIRED_ORIGINS`` origins (``MIN_PAIRED_SERIES`` series), or p >=
``ALPHA``, a difference is not significant. numpy and scipy only: the pipeline's judging
(evaluation, intervals, validate, report), the monitor and the registry's champion decision
all test with these functions.
"""

from __future__ import annotations

import math

import numpy as np

ALPHA = 0.05  # significance level: two-sided paired comparisons, the monitor's one-sided degradation tests
MIN_PAIRED_ORIGINS = 20  # fewer origins: no difference is called significant
MIN_PAIRED_SERIES = MIN_PAIRED_ORIGINS  # across series, the same bar: fewer series, never significant
BOOTSTRAP_SAMPLES = 1000


def paired_test(errors_a: np.ndarray, errors_b: np.ndarray, block: int) -> dict:
    """Diebold-Mariano test of equal accuracy of A and B on the same origins.

    ``mean_diff`` < 0 means A is more accurate. The variance of the mean difference is the
    Newey-West estimate with ``block - 1`` lags (windows of neighbouring origins overlap);
    the statistic gets the Harvey-Leybourne-Newbold small-sample correction and a t
    distribution with n - 1 degrees of freedom.
    """
    from scipy import stats

    d = np.asarray(errors_a, np.float64) - np.asarray(errors_b, np.float64)
    n = len(d)
    result = {"test": "Diebold-Mariano (Newey-West, HLN)", "origins": n, "mean_diff": float(d.mean()) if n else None,
              "statistic": None, "p_value": None, "significant": False, "min_origins": MIN_PAIRED_ORIGINS,
              "alpha": ALPHA}
    if n < MIN_PAIRED_ORIGINS:
        result["note"] = f"{n} paired origins, fewer than {MIN_PAIRED_ORIGINS}: not significant"
        return result
    lags = max(0, min(block - 1, n - 1))
    centred = d - d.mean()
    variance = float(centred @ centred) / n
    for lag in range(1, lags + 1):
        weight = 1.0 - lag / (lags + 1)
        variance += 2.0 * weight * float(centred[lag:] @ centred[:-lag]) / n
    if variance <= 0:
        identical = bool(np.allclose(d, 0.0))
        result.update(statistic=0.0 if identical else float("inf") * np.sign(d.mean()),
                      p_value=1.0 if identical else 0.0, significant=not identical)
        return result
    dm = d.mean() / math.sqrt(variance / n)
    h = lags + 1
    correction = math.sqrt(max((n + 1 - 2 * h + h * (h - 1) / n) / n, 1e-12))
    statistic = float(dm * correction)
    p_value = float(2.0 * stats.t.sf(abs(statistic), df=n - 1))
    result.update(statistic=statistic, p_value=p_value, significant=p_value < ALPHA)
    return result


def paired_across_series(a: np.ndarray, b: np.ndarray) -> dict:
    """:func:`paired_test` of per-series figures (MASE, MSIS) of A against B with block 1
    (series are the independent units: no Newey-West lags), plus the Wilcoxon signed-rank p as
    ``robust_p`` (MASE is heavy-tailed: both are reported, the verdict is the paired test's, as
    for one series). Pairs where either is NaN or infinite are left out (a series a forecaster
    did not run on is not evidence), and ``MIN_PAIRED_SERIES`` counts the pairs that are left."""
    from scipy import stats

    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both = np.isfinite(a) & np.isfinite(b)
    a, b = a[both], b[both]
    result = paired_test(a, b, block=1)
    result["test"] = "Diebold-Mariano across series (block 1, HLN)"
    result["series"] = result.pop("origins")
    result["min_series"] = result.pop("min_origins")
    if "note" in result:
        result["note"] = f"{len(a)} paired series, fewer than {MIN_PAIRED_SERIES}: not significant"
    robust = None
    if len(a) >= MIN_PAIRED_SERIES and np.any(a != b):
        robust = float(stats.wilcoxon(a, b).pvalue)
    result["robust_p"] = robust
    return result


def block_bootstrap_interval(values: np.ndarray, block: int, level: float = 0.95, seed: int = 0) -> list[float]:
    """Moving-block bootstrap percentile interval of the mean of ``values`` (per-origin MAEs,
    coverages: neighbours within ``block`` origins share forecast windows)."""
    n = len(values)
    if n < 2:
        return [float("nan"), float("nan")]
    block = max(1, min(block, n))
    rng = np.random.default_rng(seed)
    blocks = math.ceil(n / block)
    starts = rng.integers(0, n - block + 1, size=(BOOTSTRAP_SAMPLES, blocks))
    picks = (starts[:, :, None] + np.arange(block)[None, None, :]).reshape(BOOTSTRAP_SAMPLES, -1)[:, :n]
    means = values[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))]


def bootstrap_interval(values: np.ndarray, level: float = 0.95, seed: int = 0) -> list[float]:
    """Percentile bootstrap interval of the mean over series (series are independent units,
    so plain resampling, no blocks); NaNs (a forecaster that did not run there) are left out."""
    values = np.asarray(values, np.float64)
    values = values[np.isfinite(values)]
    if len(values) < 2:
        return [float("nan"), float("nan")]
    rng = np.random.default_rng(seed)
    means = np.empty(BOOTSTRAP_SAMPLES)
    for start in range(0, BOOTSTRAP_SAMPLES, 100):  # 100 resamples at a time bound the memory
        picks = rng.integers(0, len(values), size=(min(100, BOOTSTRAP_SAMPLES - start), len(values)))
        means[start:start + len(picks)] = values[picks].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))]


def judged_across_series(series: int) -> bool:
    """Whether a sample of ``series`` series is judged across series (the series are the
    independent units) rather than over the origins of its one series (dependent units: the
    windows of neighbouring origins overlap, so Newey-West or batch means). Two series are
    already two independent units, where one series' origins never are; whether there are
    enough of them is each test's minimum (``MIN_PAIRED_SERIES``, the monitor's ``MIN_SERIES``)."""
    return int(series) > 1


def paired_comparison(a: np.ndarray, b: np.ndarray, *, series: int, block: int = 1) -> dict:
    """The two-sided paired test of A against B that the sample supports
    (:func:`judged_across_series`): :func:`paired_across_series` on per-series figures, else
    :func:`paired_test` on the per-origin errors of one series with ``block``."""
    if judged_across_series(series):
        return paired_across_series(a, b)
    return paired_test(a, b, block)
