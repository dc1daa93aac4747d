"""Validate a variant: parity with PyTorch at several shapes, holdout accuracy, latency, size.

Like optimum's ``validate_model_outputs`` but every failure is collected into gates with
value and threshold; the pipeline turns failed required gates into a GateError.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxcast.base.contract import (
    METADATA_PREFIX,
    OUTPUT_NAME,
    QUANTILE_METADATA,
    QUANTILES_NAME,
    opset_of,
    parse_quantile_levels,
    read_metadata,
)
from onnxcast.base.files import sha256_file
from onnxcast.pipeline.evaluation import evaluate_baselines, holdout_origins
from onnxcast.pipeline.intervals import independent_windows, interval_metrics
from onnxcast.pipeline.metrics import forecast_metrics
from onnxcast.pipeline.seasons import evaluation_seasons
from onnxcast.pipeline.sessions import onnx_predict, onnx_predict_with_quantiles, onnx_session
from onnxcast.pipeline.significance import paired_test

log = logging.getLogger(__name__)

FP32_VARIANTS = ("fp32", "fp32-opt")
# The parity measure (:func:`tolerance_ratios`) as the gates' messages state it, here and in onnxcast.targets.
PARITY_RULE = "|diff|/(atol+rtol*max(|y|, row level))"


@dataclass(frozen=True)
class Holdout:
    """Rolling-origin holdout windows (onnxcast.pipeline.evaluation) and the scale for MASE."""

    history: np.ndarray  # [origins, lookback, F]
    actual: np.ndarray  # [origins, horizon]
    origins: np.ndarray  # index of each window's first forecast step
    mase_scale: float
    block: int = 1  # neighbouring origins whose windows overlap (for intervals and paired tests)

    @property
    def independent(self) -> int:
        """The non-overlapping windows among the origins' (intervals.independent_windows)."""
        return independent_windows(self.origins, self.actual.shape[1])


def parity_shapes(lookback: int, season: int) -> list[tuple[int, int]]:
    """Batch sizes and history lengths unlike the export's example (batch 2, lookback).

    The contract is any history of at least ``lookback`` steps (docs/architecture.md): the
    window families (N-HiTS, DLinear) read exactly the newest ``lookback`` steps, so shorter
    histories are outside it. ``season`` (<= lookback, checked by prepare_data) is unused.
    """
    del season
    return [(1, lookback), (7, lookback + 1), (16, lookback + lookback // 2 + 3), (64, lookback)]


def sample_histories(values: np.ndarray, batch: int, time_steps: int, rng: np.random.Generator) -> np.ndarray:
    """``batch`` real windows of ``time_steps`` rows from the series, at random positions."""
    if time_steps > len(values):
        raise ValueError(f"history of {time_steps} steps is longer than the series ({len(values)} rows)")
    starts = rng.integers(0, len(values) - time_steps + 1, size=batch)
    return np.stack([values[s : s + time_steps] for s in starts]).astype(np.float32)


def check_parity(reference, session, values: np.ndarray, shapes: list[tuple[int, int]],
                 rtol: float, atol: float, seed: int = 0) -> dict:
    """Compare ORT with the PyTorch ``reference`` callable at each shape.

    ``reference`` returns the forecast, or ``(forecast, quantiles)`` (:func:`torch_runner` with
    ``quantiles=True``): then both outputs are compared. Returns max abs diff, the worst
    :func:`tolerance_ratios` over every output compared (<= 1 passes) and per-shape rows.
    """
    rng = np.random.default_rng(seed)
    return parity_on(reference, session, [sample_histories(values, batch, steps, rng) for batch, steps in shapes],
                     rtol, atol)


def parity_on(reference, session, histories: list[np.ndarray], rtol: float, atol: float) -> dict:
    """:func:`check_parity` on given histories (one array per shape; a fleet samples them
    across its series)."""
    rows, worst, max_diff = [], 0.0, 0.0
    for history in histories:
        batch, steps = int(history.shape[0]), int(history.shape[1])
        expected = reference(history)
        expected = tuple(expected) if isinstance(expected, tuple | list) else (expected,)
        names = [OUTPUT_NAME, QUANTILES_NAME][:len(expected)]
        got = session.run(names, {"history": history})
        row: dict = {"batch": batch, "time": steps}
        levels = row_levels(expected[0])
        for name, want, have in zip(names, expected, got, strict=True):
            prefix = "" if name == OUTPUT_NAME else f"{name}_"
            if have.shape != want.shape:
                row[f"{prefix}error"] = f"{name} shape {list(have.shape)} != {list(want.shape)}"
                worst = float("inf")
                continue
            diff = np.abs(have.astype(np.float64) - want)
            ratio = float(np.max(tolerance_ratios(have, want, levels, rtol, atol)))
            if not (np.isfinite(have).all() and np.isfinite(ratio)):
                ratio = float("inf")  # NaN where PyTorch has a number: max() would have kept the old worst
            row[f"{prefix}max_abs_diff"], row[f"{prefix}tolerance_ratio"] = float(diff.max()), ratio
            worst, max_diff = max(worst, ratio), max(max_diff, float(np.nan_to_num(diff.max(), nan=np.inf)))
        rows.append(row)
    return {"max_abs_diff": max_diff, "worst_tolerance_ratio": worst, "shapes": rows}


def tolerance_ratios(have: np.ndarray, want: np.ndarray, levels: np.ndarray, rtol: float, atol: float) -> np.ndarray:
    """Each element's ``|have - want| / (atol + rtol * max(|want|, level of its row))``: <= 1 passes.

    ``levels`` ``[batch]`` is :func:`row_levels` of the reference forecast. A model computes each
    row at the scale of its forecast: ``quantiles = forecast + scale * offsets``, and the forecast
    itself is ``out * spread + level`` of the window. float32 rounds those terms by a few ulps of
    that scale, so an element that cancels to near zero (a lower quantile of a series in the
    thousands) keeps an absolute error of a few ulps of the level. Judged against
    ``rtol * |element|`` alone, that failed a correct export: M3 N1695, dlinear, whose 2.5%
    quantile of a row at level 1,530 came out at -0.0719, 0.00026 (two float32 ulps at 1,530)
    from PyTorch's: ratio 1.52, now 0.00017. An element at or above its row's level is judged at
    its own size as before, and a wrong output still fails: 1% of the level is a ratio of ~10 at
    rtol 1e-3. NaN anywhere (either side, or in the reference forecast) gives NaN here, which
    the callers count as a failure.
    """
    diff = np.abs(np.asarray(have, dtype=np.float64) - want)
    row = np.asarray(levels, dtype=np.float64).reshape((-1,) + (1,) * (diff.ndim - 1))
    return diff / (atol + rtol * np.maximum(np.abs(want), row))  # np.maximum keeps a NaN


def row_levels(forecast: np.ndarray) -> np.ndarray:
    """``[batch]``: the mean |forecast| of each row (each history), the scale its outputs are judged at."""
    values = np.abs(np.asarray(forecast, dtype=np.float64))
    return values.reshape(values.shape[0], -1).mean(axis=1)


def holdout_metrics(predicted: np.ndarray, holdout: Holdout) -> dict[str, float]:
    return forecast_metrics(holdout.actual, predicted, holdout.mase_scale)


def measure_latency(run, inputs: dict[int, np.ndarray], repeats: int, warmup: int = 5) -> dict[str, float]:
    """p50/p95 milliseconds of ``run(x)`` per batch size, after warm-up."""
    result = {}
    for batch, x in inputs.items():
        for _ in range(warmup):
            run(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(x)
            times.append((time.perf_counter() - start) * 1000.0)
        result[f"batch{batch}_p50"] = float(np.percentile(times, 50))
        result[f"batch{batch}_p95"] = float(np.percentile(times, 95))
    return result


def torch_runner(model, quantiles: bool = False):
    """A numpy-in, numpy-out callable for the eager PyTorch model (float64 out for parity);
    with ``quantiles``, it returns ``(forecast, quantiles)`` (``model.forecast_and_quantiles``)."""
    import torch

    def run(history: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(history)).numpy().astype(np.float64)

    def run_both(history: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.inference_mode():
            forecast, q = model.forecast_and_quantiles(torch.from_numpy(history))
            return forecast.numpy().astype(np.float64), q.numpy().astype(np.float64)

    return run_both if quantiles else run


def gate(passed: bool, value: float, threshold: float | str) -> dict:
    return {"passed": bool(passed), "value": value, "threshold": threshold}


# --- validating every variant of one family -------------------------------------------------

def holdout_origins_for(cfg, series, split):
    """The run's holdout origins in series 0 of ``series`` (a fleet of one, judged over its
    origins): every phase of the season, room for the longest look back."""
    return holdout_origins(int(series.lengths[0]), int(split.validation_end[0]), cfg.horizon,
                           evaluation_seasons(series.freq, series.season), earliest=cfg.lookback)


def baselines_for(cfg, series, split, reference: bool = False) -> dict:
    """Naive and seasonal-naive baselines (and the statistical reference) on the run's origins."""
    return evaluate_baselines(series.target(0), holdout_origins_for(cfg, series, split), cfg.horizon,
                              evaluation_seasons(series.freq, series.season), int(split.train_end[0]),
                              reference=reference, levels=cfg.levels, lookback=cfg.lookback,
                              validation_end=int(split.validation_end[0]))


def holdout_windows(cfg, series, split, mase_scale: float | None = None) -> Holdout:
    """Forecast windows at the run's holdout origins (a stride well below the horizon)."""
    origins = holdout_origins_for(cfg, series, split)
    values, target = series.series(0), series.target(0)
    history = np.stack([values[o - cfg.lookback:o] for o in origins.index]).astype(np.float32)
    actual = np.stack([target[o:o + cfg.horizon] for o in origins.index]).astype(np.float32)
    if mase_scale is None:
        mase_scale = baselines_for(cfg, series, split)["mase_scale"]
    return Holdout(history, actual, origins.index, mase_scale, origins.block)


def baseline_metrics(cfg, series, split) -> dict:
    """The best baseline's accuracy on the same holdout origins as the models."""
    return baselines_for(cfg, series, split)["seasonal_naive"]


def judge_holdout(predicted: np.ndarray, holdout: Holdout) -> tuple[dict, list[float]]:
    """Holdout metrics with the MAE's 95% interval, and the per-origin MAEs for paired tests."""
    from onnxcast.pipeline.evaluation import Origins, judged

    metrics, errors = judged(holdout.actual.astype(np.float64), predicted, holdout.mase_scale,
                             Origins(holdout.origins, 1, holdout.block))
    return metrics, errors.tolist()


def validate_family_variants(cfg, family: str, model, variants: list[dict], judged) -> dict:
    """The report entry of one family, however many series it was trained on: PyTorch figures,
    then each variant (:func:`variant_entry`) with its gates (:func:`judge_variants`).

    ``judged`` holds the holdout figures as the sample supports (``judging.judging_for``):
    :class:`OverOrigins` (one series: its holdout origins) or ``fleet_eval.AcrossSeries`` (the
    per-series table and its aggregates). Everything else is the same for both: the histories
    of parity and latency it samples, the eager model's latency, each variant's opening,
    parity, latency and size, and the gates.

    Required gates (a failure excludes the family from the choice): fp32 and fp32-opt parity
    with PyTorch, fp32 beating the best baseline by ``cfg.baseline_margin`` and (strict
    settings) their intervals' coverage. Optional variants (int8, fp16) that miss the accuracy
    budget (point or interval) or the coverage are kept in the report but marked not eligible;
    the family's ``intervals`` hold the verdict (:func:`interval_verdict`).
    """
    from functools import partial

    from onnxcast.pipeline.models import torch_threads

    latency_inputs, parity_histories = judged.histories()
    references = {False: torch_runner(model)}
    if judged.quantile_parity:  # None: the eager model has no quantiles, parity on the forecast only
        references[True] = torch_runner(model, quantiles=True) if getattr(model, "has_quantiles", False) else None
    with torch_threads(cfg.threads):
        torch_entry = {**judged.torch_holdout(references),
                       "latency_ms": measure_latency(references[False], latency_inputs, cfg.latency_repeats)}
    holdout_of = judged.variant_holdout(references)
    onnx_dir = cfg.layout.onnx_dir(family)
    entries = [variant_entry(cfg, spec, onnx_dir / spec["path"], cfg.run_dir, references, parity_histories,
                             latency_inputs, holdout_of) for spec in variants]
    judge = partial(judge_variants, entries, torch_latency=torch_entry["latency_ms"],
                    accuracy_budget=cfg.accuracy_budget, baseline_margin=cfg.baseline_margin,
                    coverage_tolerance=cfg.coverage_tolerance, strict_intervals=cfg.strict_intervals)
    return judged.family_entry(family, entries, torch_entry, judge)


class OverOrigins:
    """A family judged over the holdout origins of its one series (``judging.judging_for``),
    for :func:`validate_family_variants`: the windows at the run's origins (:func:`holdout_windows`),
    metrics with block-bootstrap intervals, per-origin MAEs and paired tests over origins.

    ``baselines``: onnxcast.pipeline.evaluation's ``evaluate_baselines`` on the run's origins.
    ``intervals_in_sample``: the intervals were recalibrated on these very windows, so their
    coverage is reported, never judged (:func:`coverage_gate`)."""

    quantile_parity = True  # the quantiles are compared with the eager model's where both have them

    def __init__(self, cfg, series, split, baselines: dict | None = None, intervals_in_sample: bool = False):
        self.cfg, self.series = cfg, series
        self.baselines = baselines or baselines_for(cfg, series, split)
        self.holdout = holdout_windows(cfg, series, split, mase_scale=self.baselines["mase_scale"])
        self.intervals_in_sample = intervals_in_sample
        self.torch_quantiles = None

    def histories(self) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
        """Latency inputs (batch 1 and 64) and the parity histories (:func:`parity_shapes`), real
        windows of the series; each from a generator seeded with ``cfg.seed``."""
        cfg, values = self.cfg, self.series.values
        rng = np.random.default_rng(cfg.seed)
        latency_inputs = {b: sample_histories(values, b, cfg.lookback, rng) for b in (1, 64)}
        rng = np.random.default_rng(cfg.seed)
        return latency_inputs, [sample_histories(values, batch, steps, rng)
                                for batch, steps in parity_shapes(cfg.lookback, self.series.season)]

    def torch_holdout(self, references: dict) -> dict:
        """The eager model's ``holdout`` and ``per_origin_mae`` (its quantiles kept for the
        intervals, set once fp32's are known)."""
        if references[True] is not None:
            predicted, self.torch_quantiles = references[True](self.holdout.history)
        else:
            predicted = references[False](self.holdout.history)
        holdout, errors = judge_holdout(predicted.astype(np.float32), self.holdout)
        return {"holdout": holdout, "per_origin_mae": errors}

    def variant_holdout(self, references: dict):
        return origins_holdout(self.cfg, self.holdout, references)

    def family_entry(self, family: str, entries: list[dict], torch_entry: dict, judge) -> dict:
        cfg, baselines, holdout = self.cfg, self.baselines, self.holdout
        baseline = baselines["seasonal_naive"]
        log.info("%s torch: holdout MAE %.4g (baseline %.4g), batch1 p50 %.3f ms", family,
                 torch_entry["holdout"]["mae"], baseline["mae"], torch_entry["latency_ms"]["batch1_p50"])
        fp32 = next((e for e in entries if e["name"] == "fp32"), None)
        torch_entry["holdout"]["intervals"] = _torch_intervals(self.torch_quantiles, holdout, fp32, cfg.levels)
        fp32_mae = fp32["holdout"]["mae"] if fp32 and fp32.get("holdout") else None
        comparisons = fp32_comparisons(fp32, baselines, holdout.block)
        failures = judge(baseline_mae=baseline["mae"], baseline_name=baselines["best"].replace("_", " "),
                         baseline_test=comparisons.get(baselines["best"]),
                         intervals_in_sample=self.intervals_in_sample)
        for entry in entries:
            status = "eligible" if entry["eligible"] else "not eligible (" + "; ".join(entry["reasons"]) + ")"
            shown = ((entry.get("holdout") or {}).get("intervals") or {})
            log.info("%s %-8s MAE %s  80%%/95%% coverage %s/%s  parity %s  b1 %s ms  b64 %s ms  %d bytes  %s",
                     family, entry["name"], figure_text((entry.get("holdout") or {}).get("mae")),
                     figure_text(shown.get("coverage_80"), ".3f"), figure_text(shown.get("coverage_95"), ".3f"),
                     figure_text(entry["parity_max_abs_diff"], ".3g"),
                     figure_text(entry["latency_ms"].get("batch1_p50"), ".3f"),
                     figure_text(entry["latency_ms"].get("batch64_p50"), ".3f"), entry["size_bytes"], status)
        return {"family": family, "torch": torch_entry, "variants": entries, "fp32_holdout_mae": fp32_mae,
                "fp32_vs": comparisons, "gates_passed": not failures, "failures": failures,
                "intervals": interval_verdict(entries)}


def fp32_comparisons(fp32: dict | None, baselines: dict, block: int) -> dict:
    """fp32 against the best baseline and the reference: the MAE ratio and the paired test on
    per-origin MAEs, and the ratios of MSIS and pinball where both have intervals."""
    comparisons: dict = {}
    if not fp32 or not fp32.get("per_origin_mae"):
        return comparisons
    errors = np.asarray(fp32["per_origin_mae"])
    mine = (fp32.get("holdout") or {}).get("intervals")
    for name in (baselines["best"], "reference"):
        other = (baselines.get("per_origin_mae") or {}).get(name)
        if other is None:
            continue
        other = np.asarray(other)
        comparisons[name] = {"mae_ratio": float(errors.mean() / other.mean()) if other.mean() else None,
                             **paired_test(errors, other, block)}
        theirs = (baselines.get("reference") if name == "reference" else baselines["seasonal_naive"]) or {}
        if mine and theirs.get("intervals"):
            comparisons[name].update(interval_ratios(mine, theirs["intervals"]))
    return comparisons


def interval_ratios(mine: dict, theirs: dict) -> dict:
    """``msis_80_ratio``, ``msis_95_ratio`` and ``pinball_ratio`` of two interval figures (< 1:
    ``mine`` is better), for the keys both hold."""
    out = {}
    for key in ("msis_80", "msis_95", "pinball"):
        if mine.get(key) is not None and theirs.get(key):
            out[f"{key}_ratio"] = float(mine[key] / theirs[key])
    return out


def _torch_intervals(quantiles: np.ndarray | None, holdout: Holdout, fp32: dict | None,
                     default_levels: tuple[float, ...]) -> dict | None:
    """The eager model's interval figures, at fp32's levels (its metadata) or the run's."""
    if quantiles is None:
        return None
    levels = tuple((((fp32 or {}).get("holdout") or {}).get("intervals") or {}).get("levels") or default_levels)
    if quantiles.shape[-1] != len(levels):
        log.warning("torch quantiles hold %d levels, expected %d: no torch intervals", quantiles.shape[-1],
                    len(levels))
        return None
    return {**interval_metrics(holdout.actual, quantiles, levels, holdout.mase_scale, block=holdout.block,
                               independent=holdout.independent),
            "levels": list(levels)}


REQUIRED_VARIANTS = FP32_VARIANTS  # a required gate failing on these fails the family
# The default margin of the baseline gate (``PipelineConfig.baseline_margin``): fp32 must be at
# least this much (relative) more accurate than the best baseline. A model equal to its anchor
# "beat" it by float32 rounding (MAE 2.3043603969 vs 2.3043604084), and rounding noise of a
# variant is of the order of the accuracy budget (1%), so a strict "<" is no gate.
BASELINE_MARGIN = 0.01


# The default of ``PipelineConfig.coverage_tolerance``, for callers that judge without a config.
COVERAGE_TOLERANCE = 0.05


def judge_variants(entries: list[dict], *, baseline_mae: float, torch_latency: dict,
                   accuracy_budget: float, baseline_name: str = "seasonal naive",
                   baseline_margin: float = BASELINE_MARGIN, baseline_test: dict | None = None,
                   metric: str = "holdout MAE", coverage_tolerance: float = COVERAGE_TOLERANCE,
                   strict_intervals: bool = False, intervals_in_sample: bool = False) -> list[str]:
    """Complete every variant entry with its gates, ``reasons``, ``eligible`` and speedups.

    The one place the gates are decided, for the pipeline and the benchmark alike. An entry
    comes with what was measured: ``holdout`` (None when the variant did not run), ``latency_ms``,
    and the gates measured on the way (``runs_on_cpu``, ``parity``). Added here:
    ``accuracy_vs_fp32`` (holdout MAE within ``accuracy_budget`` of fp32's) and
    ``beats_seasonal_naive``, one verdict per family: fp32's holdout MAE must be below the best
    baseline's by ``baseline_margin`` (relative), and every other variant carries fp32's verdict,
    so a variant of a family whose fp32 failed is never eligible however its own rounding noise
    lands. ``baseline_test`` (the paired test of fp32 against the baseline, when measured) is
    recorded in the gate for the reader. Returns the failures that fail the family: fp32 and
    fp32-opt must run and match PyTorch, and fp32 must beat the baseline. ``metric`` names the
    figure in the messages: a fleet passes mean MASE over series as ``holdout["mae"]`` and
    ``baseline_mae`` (onnxcast.pipeline.fleet_eval), so its messages say "mean MASE".

    Forecast distributions, for an entry whose ``holdout["intervals"]`` holds interval figures
    (``intervals.interval_metrics``; a model without a quantiles output has none and gets
    neither gate): ``interval_coverage``, the 80% and 95% coverage each within
    ``coverage_tolerance`` of nominal, judged only on enough independent windows
    (:func:`coverage_gate`); a miss decides only with ``strict_intervals`` (then failing on fp32
    or fp32-opt fails the family): otherwise the gate is recorded with ``enforced: false`` and the
    family's intervals are recalibrated or marked (:func:`interval_verdict`), because intervals
    alone must not keep point forecasts that beat the baseline from shipping. And for every
    variant but fp32 ``interval_accuracy_vs_fp32``, its msis_95 and pinball each within
    ``accuracy_budget`` (relative) of fp32's.
    """
    fp32 = next((e for e in entries if e["name"] == "fp32"), None)
    fp32_mae = fp32["holdout"]["mae"] if fp32 and fp32.get("holdout") else None
    fp32_intervals = ((fp32 or {}).get("holdout") or {}).get("intervals")
    fp32_coverage = coverage_gate(fp32_intervals, coverage_tolerance, in_sample=intervals_in_sample) \
        if fp32_intervals else None
    # Without strict_intervals a miss of fp32 does not decide (its intervals are recalibrated or
    # marked for the whole family), but a variant whose coverage misses where fp32's was judged
    # calibrated lost what fp32 has (quantization): it is not eligible, the family stands.
    fp32_calibrated = bool(fp32_coverage and fp32_coverage["judged"] and fp32_coverage["passed"])
    verdict = baseline_verdict(fp32_mae, baseline_mae, baseline_margin, baseline_test)
    failures = []
    if fp32 is None:
        failures.append("fp32: no fp32 variant to validate")
    for entry in entries:
        _gate_entry(entry, fp32_mae=fp32_mae, fp32_intervals=fp32_intervals, fp32_calibrated=fp32_calibrated,
                    verdict=verdict, accuracy_budget=accuracy_budget, coverage_tolerance=coverage_tolerance,
                    strict_intervals=strict_intervals, intervals_in_sample=intervals_in_sample)
        entry["reasons"] = [_reason(name, g) for name, g in entry["gates"].items()
                            if not g["passed"] and g.get("enforced", True)]
        entry["eligible"] = bool(entry.get("holdout")) and not entry["reasons"]
        latency = entry.get("latency_ms") or {}
        entry["speedup_vs_torch"] = {key: torch_latency[key] / latency[key]
                                     for key in ("batch1_p50", "batch64_p50")
                                     if latency.get(key) and torch_latency.get(key)}
        if entry["name"] in REQUIRED_VARIANTS:
            failures += _required_failures(entry, verdict, metric=metric, baseline_name=baseline_name,
                                           baseline_mae=baseline_mae, baseline_margin=baseline_margin,
                                           strict_intervals=strict_intervals)
    return failures


def _gate_entry(entry: dict, *, fp32_mae: float | None, fp32_intervals: dict | None, fp32_calibrated: bool,
                verdict: dict, accuracy_budget: float, coverage_tolerance: float, strict_intervals: bool,
                intervals_in_sample: bool) -> None:
    """Add the gates judged on a variant's holdout figures (none when it did not run):
    accuracy vs fp32, the family's baseline verdict, and its intervals' coverage and accuracy."""
    gates, holdout = entry["gates"], entry.get("holdout")
    if not holdout:
        return
    if fp32_mae:
        loss = holdout["mae"] / fp32_mae - 1.0
        gates["accuracy_vs_fp32"] = gate(loss <= accuracy_budget, loss, accuracy_budget)
    else:
        gates["accuracy_vs_fp32"] = gate(False, "fp32 has no holdout figures", accuracy_budget)
    gates["beats_seasonal_naive"] = dict(verdict)
    intervals = holdout.get("intervals")
    if not intervals:
        return
    enforced = strict_intervals or (entry["name"] != "fp32" and fp32_calibrated)
    coverage = coverage_gate(intervals, coverage_tolerance, enforced=enforced, in_sample=intervals_in_sample)
    if coverage is not None:
        gates["interval_coverage"] = coverage
    if entry["name"] != "fp32":
        gates["interval_accuracy_vs_fp32"] = interval_accuracy_gate(intervals, fp32_intervals, accuracy_budget)


def _required_failures(entry: dict, verdict: dict, *, metric: str, baseline_name: str, baseline_mae: float,
                       baseline_margin: float, strict_intervals: bool) -> list[str]:
    """What fails the family in a required variant (fp32, fp32-opt): it does not run, its
    parity, fp32's baseline verdict, and (``strict_intervals``) its coverage."""
    name, gates = entry["name"], entry["gates"]
    if "runs_on_cpu" in gates and not gates["runs_on_cpu"]["passed"]:
        return [f"{name} does not run with ONNX Runtime's CPU provider: {gates['runs_on_cpu']['value']}"]
    failures = []
    if "parity" in gates and not gates["parity"]["passed"]:
        diff = entry.get("parity_max_abs_diff")
        failures.append(f"{name} parity with PyTorch: worst {PARITY_RULE} "
                        f"{figure_text(gates['parity']['value'], '.3g')} > 1 (max abs diff {figure_text(diff, '.3g')})")
    if name == "fp32" and not gates["beats_seasonal_naive"]["passed"]:
        failures.append(f"fp32 {metric} {figure_text(entry['holdout']['mae'])} does not beat the best baseline "
                        f"({baseline_name}) {figure_text(baseline_mae)} by the {figure_text(100 * baseline_margin, '.3g')}% "
                        f"margin (needs below {figure_text(verdict['threshold'])})")
    coverage = gates.get("interval_coverage")
    if coverage and not coverage["passed"] and strict_intervals:
        failures += [f"{name} {phrase}" for phrase in coverage["failures"]]
    return failures


def coverage_gate(intervals: dict, tolerance: float, *, enforced: bool = True, in_sample: bool = False) -> dict | None:
    """The ``interval_coverage`` gate: ``value`` is the largest distance of the 80% and 95%
    coverage from nominal (None when the levels hold neither interval: nothing to judge).

    ``judged``: whether the figures can refuse anything: not with fewer ``independent_windows``
    than intervals.MIN_INDEPENDENT_WINDOWS, nor ``in_sample`` (intervals calibrated on the very
    windows they are measured on); such a gate passes with a ``note`` saying why it was not
    judged. ``enforced``: whether a judged miss makes the variant ineligible (the
    ``strict_intervals`` setting); a gate that is not enforced is reported, never a reason."""
    from onnxcast.pipeline.intervals import (
        MIN_INDEPENDENT_WINDOWS,
        coverage_failures,
        coverage_keys,
        judged,
        not_judged_note,
    )

    keys = [k for k in coverage_keys(intervals) if intervals.get(f"coverage_{k}") is not None]
    if not keys:
        return None
    distances = [abs(intervals[f"coverage_{k}"] - float(k) / 100) for k in keys]
    independent = intervals.get("independent_windows")
    note = None
    if in_sample:
        note = "not judged: in-sample (the intervals were recalibrated on these holdout windows)"
    elif not judged(independent):
        note = not_judged_note(independent)
    failures = [] if note else coverage_failures(intervals, tolerance)
    out = gate(not failures, float(np.max(distances)), tolerance)
    out.update(coverage={k: intervals.get(f"coverage_{k}") for k in keys}, failures=failures,
               ci95={k: intervals.get(f"coverage_{k}_ci95") for k in keys}, judged=note is None,
               independent_windows=independent, min_independent_windows=MIN_INDEPENDENT_WINDOWS,
               enforced=bool(enforced))
    if note:
        out["note"] = note
    return out


# What a family's intervals are, for the report, the ONNX metadata and the rollout manifest
# (docs/intervals.md, "Gates"): judged and within their tolerance; too few independent holdout
# windows to judge; missed and recalibrated on the most recent windows (one series); missed and
# shipped as they are, marked (a fleet); missed and refused (strict_intervals).
INTERVAL_STATUSES = ("calibrated", "not_judged", "recalibrated", "uncalibrated", "refused")


def interval_verdict(entries: list[dict]) -> dict | None:
    """The family's ``intervals``: the status (:data:`INTERVAL_STATUSES`) fp32's coverage gate
    gives, its coverage and how many independent windows it rests on; also set as every
    variant's ``intervals_status``. None for a model without intervals."""
    fp32 = next((e for e in entries if e["name"] == "fp32"), None)
    coverage = ((fp32 or {}).get("gates") or {}).get("interval_coverage")
    if coverage is None:
        return None
    if not coverage["judged"]:
        status = "not_judged"
    elif coverage["passed"]:
        status = "calibrated"
    else:
        status = "refused" if coverage["enforced"] else "uncalibrated"
    verdict = {"status": status, "coverage": coverage["coverage"],
               "independent_windows": coverage.get("independent_windows"),
               "min_independent_windows": coverage.get("min_independent_windows")}
    if coverage.get("note"):
        verdict["note"] = coverage["note"]
    if coverage["failures"]:
        verdict["missed"] = coverage["failures"]
    for entry in entries:
        entry["intervals_status"] = status
    return verdict


def interval_accuracy_gate(intervals: dict, fp32_intervals: dict | None, budget: float) -> dict:
    """The ``interval_accuracy_vs_fp32`` gate: msis_95 (where the levels hold it) and pinball
    each at most ``budget`` (relative) worse than fp32's; ``value`` is the larger loss."""
    if not fp32_intervals:
        return gate(False, "fp32 has no interval figures", budget)
    losses = {}
    for key in ("msis_95", "pinball"):
        mine, theirs = intervals.get(key), fp32_intervals.get(key)
        if mine is None or theirs is None:
            continue
        losses[key] = mine / theirs - 1.0 if theirs else (0.0 if mine == theirs else float("inf"))
    if not losses:
        return gate(False, "no msis_95 or pinball to compare", budget)
    worst = float(np.max(list(losses.values())))  # nan propagates, and fails
    out = gate(worst <= budget, worst, budget)  # nan fails
    out["losses"] = losses
    return out


def baseline_verdict(fp32_mae: float | None, baseline_mae: float, margin: float, test: dict | None = None) -> dict:
    """The family's ``beats_seasonal_naive`` gate, decided on its fp32 holdout MAE.

    ``threshold`` is the MAE to stay below: the baseline's less ``margin`` of it, so a model
    equal to the baseline (or within rounding of it) fails. ``value`` is fp32's MAE.
    """
    threshold = baseline_mae * (1.0 - margin)
    if fp32_mae is None:
        out = gate(False, "fp32 has no holdout figures", threshold)
    else:
        out = gate(fp32_mae < threshold, fp32_mae, threshold)
    out.update(judged_on="fp32", baseline_mae=baseline_mae, margin=margin)
    if fp32_mae is not None and baseline_mae:
        out["mae_ratio"] = fp32_mae / baseline_mae
    if test:
        out["paired_test"] = {k: test.get(k) for k in ("mean_diff", "p_value", "significant", "origins")}
    return out


def _reason(name: str, g: dict) -> str:
    if g.get("failures"):  # interval_coverage: the phrases say which interval missed, and by how much
        return f"{name}: " + "; ".join(g["failures"])
    via = " (fp32's verdict: one per family)" if name == "beats_seasonal_naive" and g.get("judged_on") else ""
    return f"{name}: {figure_text(g['value'])} vs threshold {figure_text(g['threshold'])}{via}"


def figure_text(value, spec: str = ".4g") -> str:
    """A figure for a log line; 'n/a' where nothing was measured."""
    if value is None:
        return "n/a"
    return format(value, spec) if isinstance(value, int | float) else str(value)


def variant_entry(cfg, spec: dict, path: Path, run_root: Path, references: dict, parity_histories: list[np.ndarray],
                  latency_inputs: dict[int, np.ndarray], holdout_of) -> dict:
    """One variant's entry, however its family is judged: opened with ONNX Runtime (the
    ``runs_on_cpu`` gate when it cannot be), parity with the eager model on ``parity_histories``
    (:func:`parity_on`; the ``parity`` gate of fp32 and fp32-opt), the holdout figures that
    ``holdout_of(entry, session, levels, note)`` adds as the judging has them (over origins or
    across series; ``levels``/``note``: :func:`variant_levels`), then latency and size.

    ``references`` maps "with quantiles" to the torch callable (:func:`torch_runner`): with a
    True key (None when the eager model has no quantiles) the quantiles are compared too where
    the variant has them, and ``parity_outputs`` says which were; without one (across series)
    parity is on the forecast only."""
    import onnx

    name = spec["name"]
    entry = {"name": name, "onnx_path": str(path.relative_to(run_root)), "sha256": sha256_file(path),
             "size_bytes": path.stat().st_size, "opset": None,
             "note": spec.get("note", ""), "parity_max_abs_diff": None, "parity_shapes": [],
             "holdout": None, "latency_ms": {}, "gates": {}}
    try:
        proto = onnx.load(path, load_external_data=False)
        entry["opset"] = opset_of(proto)
        session = onnx_session(path, cfg.threads)
        session.run(["forecast"], {"history": latency_inputs[1]})
    except Exception as exc:  # noqa: BLE001 - onnx and ORT raise their own exception types per failure kind
        # e.g. fp16 kernels missing on a CPU build, or a file that is no ONNX model at all:
        # the variant cannot be validated here, and judge_variants decides what that fails
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        entry["gates"]["runs_on_cpu"] = gate(False, first, "runs with CPUExecutionProvider")
        return entry
    levels, note = variant_levels(proto, session)
    both = levels is not None and references.get(True) is not None
    parity = parity_on(references[both], session, parity_histories, cfg.parity_rtol, cfg.parity_atol)
    entry["parity_max_abs_diff"] = parity["max_abs_diff"]
    entry["parity_shapes"] = parity["shapes"]
    if True in references:
        entry["parity_outputs"] = [OUTPUT_NAME, QUANTILES_NAME] if both else [OUTPUT_NAME]
    if name in FP32_VARIANTS:
        entry["gates"]["parity"] = gate(parity["worst_tolerance_ratio"] <= 1.0, parity["worst_tolerance_ratio"], 1.0)
    holdout_of(entry, session, levels, note)
    entry["latency_ms"] = measure_latency(lambda x: session.run(["forecast"], {"history": x}), latency_inputs,
                                          cfg.latency_repeats)
    return entry


def origins_holdout(cfg, holdout: Holdout, references: dict):
    """``holdout_of`` for :func:`variant_entry` judged over origins: the variant's forecasts
    (and intervals where it has quantiles) at the holdout origins, and its per-origin MAEs."""
    def holdout_of(entry: dict, session, levels, note: str) -> None:
        if levels is None:
            entry["holdout"], entry["per_origin_mae"] = judge_holdout(onnx_predict(session, holdout.history), holdout)
            entry["holdout"]["intervals"] = None
            entry["intervals_note"] = note
            return
        forecast, quantiles = onnx_predict_with_quantiles(session, holdout.history)
        entry["holdout"], entry["per_origin_mae"] = judge_holdout(forecast, holdout)
        entry["holdout"]["intervals"] = {**interval_metrics(holdout.actual, quantiles, levels, holdout.mase_scale,
                                                            block=holdout.block, seed=cfg.seed,
                                                            independent=holdout.independent),
                                         "levels": list(levels)}
        if references.get(True) is None:
            entry["intervals_note"] = "the PyTorch model has no quantiles: parity on the forecast only"

    return holdout_of


def variant_levels(proto, session) -> tuple[tuple[float, ...] | None, str]:
    """The levels of a variant's ``quantiles`` output (its metadata ``onnxcast.quantile_levels``),
    or None and why not: a model from before forecast distributions has no such output."""
    if QUANTILES_NAME not in {o.name for o in session.get_outputs()}:
        return None, (f"no {QUANTILES_NAME!r} output (a model from before forecast distributions): "
                      "no intervals and no interval gates")
    text = read_metadata(proto).get(QUANTILE_METADATA)
    where = f"{METADATA_PREFIX}{QUANTILE_METADATA}"
    if text is None:
        return None, f"a {QUANTILES_NAME!r} output without the metadata {where}: no intervals and no interval gates"
    try:
        return parse_quantile_levels(text, where), ""
    except ValueError as exc:
        return None, f"{exc}: no intervals and no interval gates"
