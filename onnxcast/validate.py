"""Validate a variant: parity with PyTorch at several shapes, holdout accuracy, latency, size.

Like optimum's ``validate_model_outputs`` but every failure is collected into gates with
value and threshold; the pipeline turns failed required gates into a GateError.
"""

from __future__ import annotations

import hashlib
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxcast.accuracy import forecast_metrics

log = logging.getLogger(__name__)

FP32_VARIANTS = ("fp32", "fp32-opt")


@dataclass(frozen=True)
class Holdout:
    """Rolling-origin holdout windows and the scale for MASE."""

    history: np.ndarray  # [origins, lookback, F]
    actual: np.ndarray  # [origins, horizon]
    origins: np.ndarray
    mase_scale: float


def onnx_session(path: str | Path, threads: int = 1, spinning: bool = False):
    """An ORT CPU session with explicit threading: parallel workers must not oversubscribe."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_predict(session, history: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """Forecasts for ``history [N, time, F]`` with an ORT session, in batches."""
    outputs = [session.run(["forecast"], {"history": history[i : i + batch_size]})[0]
               for i in range(0, len(history), batch_size)]
    return np.concatenate(outputs).astype(np.float32)


def parity_shapes(lookback: int, season: int) -> list[tuple[int, int]]:
    """Batch sizes and history lengths unlike the export's example (batch 2, lookback)."""
    shortest = max(season, 2, lookback // 2 + 1)
    return [(1, lookback), (7, shortest), (16, lookback + lookback // 2 + 3), (64, lookback)]


def sample_histories(values: np.ndarray, batch: int, time_steps: int, rng: np.random.Generator) -> np.ndarray:
    """``batch`` real windows of ``time_steps`` rows from the series, at random positions."""
    if time_steps > len(values):
        raise ValueError(f"history of {time_steps} steps is longer than the series ({len(values)} rows)")
    starts = rng.integers(0, len(values) - time_steps + 1, size=batch)
    return np.stack([values[s : s + time_steps] for s in starts]).astype(np.float32)


def check_parity(reference, session, values: np.ndarray, shapes: list[tuple[int, int]],
                 rtol: float, atol: float, seed: int = 0) -> dict:
    """Compare ORT with the PyTorch ``reference`` callable at each shape.

    Returns max abs diff, the worst ``|a-b| / (atol + rtol*|b|)`` (<= 1 passes) and per-shape rows.
    """
    rng = np.random.default_rng(seed)
    rows, worst, max_diff = [], 0.0, 0.0
    for batch, steps in shapes:
        history = sample_histories(values, batch, steps, rng)
        expected = reference(history)
        got = session.run(["forecast"], {"history": history})[0]
        if got.shape != expected.shape:
            rows.append({"batch": batch, "time": steps, "error": f"shape {list(got.shape)} != {list(expected.shape)}"})
            worst = float("inf")
            continue
        diff = np.abs(got.astype(np.float64) - expected)
        ratio = float(np.max(diff / (atol + rtol * np.abs(expected))))
        rows.append({"batch": batch, "time": steps, "max_abs_diff": float(diff.max()), "tolerance_ratio": ratio})
        worst, max_diff = max(worst, ratio), max(max_diff, float(diff.max()))
    return {"max_abs_diff": max_diff, "worst_tolerance_ratio": worst, "shapes": rows}


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


@contextmanager
def torch_threads(threads: int):
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def torch_runner(model):
    """A numpy-in, numpy-out callable for the eager PyTorch model (float64 out for parity)."""
    import torch

    def run(history: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(torch.from_numpy(history)).numpy().astype(np.float64)

    return run


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def gate(passed: bool, value: float, threshold: float | str) -> dict:
    return {"passed": bool(passed), "value": value, "threshold": threshold}


# --- validating every variant of one family -------------------------------------------------

def holdout_windows(cfg, series, split) -> Holdout:
    """Non-overlapping forecast windows across the holdout, one origin every ``horizon`` steps."""
    from onnxcast.accuracy import mase_scale
    from onnxcast.data import windows

    history, actual, origins = windows(series.values, cfg.lookback, cfg.horizon,
                                       split.validation_end, split.rows, stride=cfg.horizon)
    return Holdout(history, actual, origins, mase_scale(series.target[: split.train_end], series.season))


def baseline_metrics(cfg, series, split) -> dict:
    """Seasonal-naive accuracy on the same holdout windows as the models."""
    from onnxcast.accuracy import seasonal_naive

    holdout = holdout_windows(cfg, series, split)
    forecast = seasonal_naive(series.target, holdout.origins, cfg.horizon, series.season)
    return {"season": series.season, "origins": int(len(holdout.origins)), **holdout_metrics(forecast, holdout)}


def validate_variants(cfg, family: str, model, series, split, onnx_dir: Path, variants: list[dict]) -> dict:
    """The report entry of one family: PyTorch figures, then each variant with its gates.

    Required gates (a failure fails the run): fp32 and fp32-opt parity with PyTorch, and fp32
    beating the seasonal-naive baseline. Optional variants (int8, fp16) that miss the
    accuracy budget are kept in the report but marked not eligible.
    """
    holdout = holdout_windows(cfg, series, split)
    baseline = baseline_metrics(cfg, series, split)
    rng = np.random.default_rng(cfg.seed)
    latency_inputs = {b: sample_histories(series.values, b, cfg.lookback, rng) for b in (1, 64)}
    shapes = parity_shapes(cfg.lookback, series.season)
    reference = torch_runner(model)

    with torch_threads(cfg.threads):
        torch_pred = reference(holdout.history).astype(np.float32)
        torch_entry = {"holdout": holdout_metrics(torch_pred, holdout),
                       "latency_ms": measure_latency(reference, latency_inputs, cfg.latency_repeats)}
    log.info("%s torch: holdout MAE %.4g (baseline %.4g), batch1 p50 %.3f ms", family,
             torch_entry["holdout"]["mae"], baseline["mae"], torch_entry["latency_ms"]["batch1_p50"])

    entries, failures = [], []
    fp32_mae = None
    for spec in variants:
        entry = _validate_one(cfg, spec, onnx_dir / spec["path"], reference, series, holdout, shapes,
                              latency_inputs, onnx_dir.parent.parent.parent)
        if spec["name"] == "fp32":
            fp32_mae = entry["holdout"]["mae"]
        entries.append(entry)

    for entry in entries:
        gates = entry["gates"]
        if entry.get("holdout") and fp32_mae:
            loss = entry["holdout"]["mae"] / fp32_mae - 1.0
            gates["accuracy_vs_fp32"] = gate(loss <= cfg.accuracy_budget, loss, cfg.accuracy_budget)
        if entry.get("holdout"):
            gates["beats_seasonal_naive"] = gate(entry["holdout"]["mae"] < baseline["mae"],
                                                 entry["holdout"]["mae"], baseline["mae"])
        entry["reasons"] = [f"{name}: {g['value']:.4g} vs threshold {g['threshold']}" if isinstance(g["value"], float)
                            else f"{name}: {g['value']}" for name, g in gates.items() if not g["passed"]]
        entry["eligible"] = not entry["reasons"]
        entry["speedup_vs_torch"] = {
            key: torch_entry["latency_ms"][key] / entry["latency_ms"][key]
            for key in ("batch1_p50", "batch64_p50") if entry["latency_ms"].get(key)}
        if entry["name"] in FP32_VARIANTS and "parity" in gates and not gates["parity"]["passed"]:
            failures.append(f"{entry['name']} parity with PyTorch: worst |diff|/(atol+rtol*|y|) "
                            f"{gates['parity']['value']:.3g} > 1 (max abs diff {entry['parity_max_abs_diff']:.3g})")
        if entry["name"] == "fp32" and not gates["beats_seasonal_naive"]["passed"]:
            failures.append(f"fp32 holdout MAE {entry['holdout']['mae']:.4g} does not beat seasonal naive "
                            f"{baseline['mae']:.4g}")
        status = "eligible" if entry["eligible"] else "not eligible (" + "; ".join(entry["reasons"]) + ")"
        mae = entry["holdout"]["mae"] if entry.get("holdout") else float("nan")
        log.info("%s %-8s MAE %.4g  parity %.3g  b1 %.3f ms  b64 %.3f ms  %d bytes  %s", family, entry["name"],
                 mae, entry["parity_max_abs_diff"] if entry["parity_max_abs_diff"] is not None else float("nan"), entry["latency_ms"].get("batch1_p50", float("nan")),
                 entry["latency_ms"].get("batch64_p50", float("nan")), entry["size_bytes"], status)

    return {"family": family, "torch": torch_entry, "variants": entries, "fp32_holdout_mae": fp32_mae,
            "gates_passed": not failures, "failures": failures}


def _validate_one(cfg, spec: dict, path: Path, reference, series, holdout: Holdout, shapes, latency_inputs,
                  run_root: Path) -> dict:
    import onnx

    from onnxcast.export import opset_of

    name = spec["name"]
    entry = {"name": name, "onnx_path": str(path.relative_to(run_root)), "sha256": file_sha256(path),
             "size_bytes": path.stat().st_size, "opset": opset_of(onnx.load(path, load_external_data=False)),
             "note": spec.get("note", ""), "parity_max_abs_diff": None, "parity_shapes": [],
             "holdout": None, "latency_ms": {}, "gates": {}}
    try:
        session = onnx_session(path, cfg.threads)
        session.run(["forecast"], {"history": latency_inputs[1]})
    except Exception as exc:  # ORT raises its own exception types per failure kind
        # e.g. fp16 kernels missing on a CPU build: the variant cannot be validated here
        entry["gates"]["runs_on_cpu"] = gate(False, str(exc).splitlines()[0][:200], "runs with CPUExecutionProvider")
        return entry
    parity = check_parity(reference, session, series.values, shapes, cfg.parity_rtol, cfg.parity_atol, cfg.seed)
    entry["parity_max_abs_diff"] = parity["max_abs_diff"]
    entry["parity_shapes"] = parity["shapes"]
    if name in FP32_VARIANTS:
        entry["gates"]["parity"] = gate(parity["worst_tolerance_ratio"] <= 1.0, parity["worst_tolerance_ratio"], 1.0)
    entry["holdout"] = holdout_metrics(onnx_predict(session, holdout.history), holdout)
    entry["latency_ms"] = measure_latency(lambda x: session.run(["forecast"], {"history": x}), latency_inputs,
                                          cfg.latency_repeats)
    return entry
