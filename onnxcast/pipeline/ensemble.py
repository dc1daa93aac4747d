"""The ``ensemble`` family: the run's trained families combined into one model, one ONNX graph.

Trained after its members (every other family of the run that trained), it forecasts the
validation windows the members were early-stopped on with each member, and chooses how to
combine them there (:func:`choose_combination`): non-negative weights summing to 1 that
minimise the scaled MAE (each window's error divided by its series' MASE scale, as training's
loss weighs it), searched on a grid of the simplex, or the median of the members' forecasts
when the weights do not beat the median by :data:`WEIGHTS_MARGIN` there. The model
(onnxcast.pipeline.models.EnsembleForecaster) holds the members as they were trained, each with
its own normalisation and clip at 0, so it is calibrated, exported, optimized, validated, gated
and selected like any family; its quantiles are calibrated again on the ensemble's own
validation errors (onnxcast.pipeline.intervals.calibrate), not combined from the members'.
With fewer than two trained members it is skipped, and the report says why (docs/ensemble.md).
"""

from __future__ import annotations

import itertools
import logging
import time

import numpy as np

from onnxcast.base.files import read_json, write_json
from onnxcast.pipeline.checkpoint import load_model, save_model
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.data import windows
from onnxcast.pipeline.fleet_data import ACROSS_SERIES, judging_for, load_split
from onnxcast.pipeline.fleet_train import validation_windows

log = logging.getLogger(__name__)

ENSEMBLE = "ensemble"
# The weights must lower the median's validation loss by this share to be used: with few
# validation windows a weight that only fits their noise keeps the median (1%: the margin by
# which a family must beat its baseline, baseline_margin's default).
WEIGHTS_MARGIN = 0.01
# Grid steps of the simplex: 1/20 for up to four members (1,771 points), 1/10 beyond.
GRID_STEPS = {2: 20, 3: 20, 4: 20}
GRID_STEPS_MANY = 10


def member_families(cfg: PipelineConfig) -> list[str]:
    """The run's families other than the ensemble that have a trained model, in the run's order."""
    return [f for f in cfg.models if f != ENSEMBLE and cfg.layout.model_json(f).exists()]


def skipped_path(cfg: PipelineConfig, family: str = ENSEMBLE):
    return cfg.layout.skipped(family)


def skipped_families(cfg: PipelineConfig) -> list[dict]:
    """``[{"family", "reason"}]`` of the families of the run that were skipped."""
    return [read_json(skipped_path(cfg, f)) for f in cfg.models if skipped_path(cfg, f).exists()]


def train_ensemble(cfg: PipelineConfig, family: str = ENSEMBLE) -> dict:
    """Combine the trained members into the ensemble's model.pt and model.json; returns
    ``{"family", "combination", "members", "weights"}``, or ``{"family", "skipped": reason}``
    (also written to ``models/ensemble/skipped.json``) with fewer than two trained members."""
    members = member_families(cfg)
    path = skipped_path(cfg, family)
    if len(members) < 2:
        reason = (f"needs at least two trained member families, the run trained {len(members)}"
                  + (f" ({', '.join(members)})" if members else ""))
        log.warning("%s skipped: %s", family, reason)
        write_json(path, {"family": family, "reason": reason})
        return {"family": family, "skipped": reason}
    path.unlink(missing_ok=True)
    started = time.monotonic()
    loaded = [load_model(cfg, f) for f in members]
    x, y, w = ensemble_validation(cfg, loaded[0][1])
    forecasts = member_forecasts([model for model, _ in loaded], x)
    choice = choose_combination(forecasts, y, w, members)
    if choice["combination"] == "weighted":  # a member of weight 0 is not computed: left out of the graph
        kept = [i for i, v in enumerate(choice["weights"]) if v > 0]
        model, spec = build_ensemble([loaded[i] for i in kept], [choice["weights"][i] for i in kept])
    else:
        model, spec = build_ensemble(loaded, ())
    choice["in_graph"] = [m["family"] for m in spec.members]
    seconds = time.monotonic() - started
    log.info("%s of %s: %s (validation scaled MAE %.4g; median %.4g; best member %s %.4g) in %.1fs", family,
             ", ".join(members), choice["combination"], choice["validation_loss"][choice["combination"]],
             choice["validation_loss"]["median"], choice["best_member"],
             choice["validation_loss"]["members"][choice["best_member"]], seconds)
    training = {"epochs": 0, "best_epoch": 0, "best_validation_loss": choice["validation_loss"][choice["combination"]],
                "stopped": "combined", "seconds": seconds}
    save_model(cfg, family, model, spec, {"source": "trained", "training": training, "ensemble": choice})
    return {"family": family, "combination": choice["combination"], "members": members, "weights": choice["weights"]}


def ensemble_validation(cfg: PipelineConfig, spec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The validation windows ``(x, y, w)`` the members were stopped on: one a series (at most
    ``fleet_validation_series``, ``w`` its ``1 / mase_scale``) across series, every validation
    window of the one series otherwise (``w`` 1)."""
    series, split = load_split(cfg.layout.fleet, cfg, mmap=True)
    if judging_for(series.n_series) == ACROSS_SERIES:
        return validation_windows(series, split, spec.lookback, spec.horizon, season=spec.season,
                                  max_series=cfg.fleet_validation_series, seed=cfg.seed)
    x, y = windows(series.values, spec.lookback, spec.horizon, int(split.train_end[0]),
                   int(split.validation_end[0]))[:2]
    return x, y, np.ones(len(x), dtype=np.float32)


def member_forecasts(models: list, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """``[n, horizon, members]`` float64: each member's forecast of the windows ``x``."""
    import torch

    out = []
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            part = torch.from_numpy(np.ascontiguousarray(x[start:start + batch_size], dtype=np.float32))
            out.append(torch.stack([m.eval()(part) for m in models], dim=-1).double().numpy())
    return np.concatenate(out)


def scaled_mae(forecast: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Mean of ``w * |forecast - y|`` over windows and steps (the scaled MAE of the windows)."""
    return float(np.mean(np.abs(forecast - y) * w[:, None]))


def simplex_grid(count: int) -> np.ndarray:
    """``[points, count]``: every weight vector of ``count`` non-negative multiples of ``1/steps``
    summing to 1 (the corners, the members alone, included)."""
    steps = GRID_STEPS.get(count, GRID_STEPS_MANY)
    points = [c for c in itertools.product(range(steps + 1), repeat=count - 1) if sum(c) <= steps]
    grid = np.array([[*c, steps - sum(c)] for c in points], dtype=np.float64)
    return grid / steps


def fit_weights(forecasts: np.ndarray, y: np.ndarray, w: np.ndarray, chunk: int = 64) -> tuple[np.ndarray, float]:
    """``(weights, loss)``: the grid point of the simplex with the lowest :func:`scaled_mae` of
    ``forecasts [n, H, M] @ weights`` against ``y [n, H]``; ties go to the earlier point."""
    grid = simplex_grid(forecasts.shape[2])
    losses = np.empty(len(grid))
    flat = forecasts.reshape(-1, forecasts.shape[2])
    target = y.reshape(-1).astype(np.float64)
    weight = np.repeat(w.astype(np.float64), y.shape[1])
    for start in range(0, len(grid), chunk):
        combined = flat @ grid[start:start + chunk].T  # [n * H, chunk]
        losses[start:start + chunk] = (np.abs(combined - target[:, None]) * weight[:, None]).mean(axis=0)
    best = int(np.argmin(losses))
    return grid[best], float(losses[best])


def choose_combination(forecasts: np.ndarray, y: np.ndarray, w: np.ndarray, members: list[str]) -> dict:
    """The combination of the members' validation ``forecasts [n, H, M]``: the fitted weights
    when their scaled MAE is :data:`WEIGHTS_MARGIN` below the median's, else the median; with
    every loss, for model.json and the report."""
    median = scaled_mae(np.median(forecasts, axis=2), y, w)
    weights, weighted = fit_weights(forecasts, y, w)
    alone = {m: scaled_mae(forecasts[:, :, i], y, w) for i, m in enumerate(members)}
    use_weights = weighted < median * (1.0 - WEIGHTS_MARGIN)
    return {
        "members": list(members),
        "combination": "weighted" if use_weights else "median",
        "weights": [round(float(v), 6) for v in weights] if use_weights else [],
        "fitted_weights": [round(float(v), 6) for v in weights],
        "validation_loss": {"median": median, "weighted": weighted, "members": alone},
        "best_member": min(alone, key=alone.get),
        "validation_windows": int(len(y)),
        "loss": "scaled MAE (each window's absolute error / its series' MASE scale)",
        "rule": f"weights when their validation loss is at least {WEIGHTS_MARGIN:.0%} below the median's",
        "intervals": "split-conformal on the ensemble's own validation errors",
    }


def build_ensemble(loaded: list[tuple], weights) -> tuple:
    """``(model, spec)`` of the ensemble of the loaded members ``[(model, spec)]``: their specs
    without quantiles (the ensemble calibrates its own), their weights copied in."""
    from dataclasses import replace

    from onnxcast.pipeline.models import ModelSpec, build_model

    specs = [replace(spec, quantile_levels=()) for _, spec in loaded]
    first = specs[0]
    spec = ModelSpec(family=ENSEMBLE, n_features=first.n_features, horizon=first.horizon, lookback=first.lookback,
                     season=first.season, seasons=first.seasons, global_model=first.global_model,
                     n_series=first.n_series, nonnegative=all(s.nonnegative for s in specs),
                     members=tuple(s.to_dict() for s in specs), weights=tuple(float(v) for v in weights))
    model = build_model(spec)
    for target, (member, _) in zip(model.core, loaded, strict=True):
        state = {k: v for k, v in member.state_dict().items() if k != "quantile_offsets"}
        target.load_state_dict(state)
    return model.eval(), spec


def ensemble_last(families) -> list[str]:
    """``families`` in order with the ensemble moved last (it combines the ones trained before it)."""
    return [f for f in families if f != ENSEMBLE] + [f for f in families if f == ENSEMBLE]


def ensemble_metadata(spec) -> dict[str, str]:
    """The ONNX metadata of an ensemble (``spec``: its ModelSpec): members, combination,
    weights; empty for another family."""
    if not spec.members:
        return {}
    return {"ensemble_members": ",".join(m["family"] for m in spec.members),
            "ensemble_combination": "weighted" if spec.weights else "median",
            "ensemble_weights": ",".join(f"{w:.6g}" for w in spec.weights)}


def ensemble_summary(model_json: dict) -> dict | None:
    """What the report and MLflow say of an ensemble: members, combination, weights, the
    validation losses; None for another family."""
    choice = model_json.get("ensemble")
    if not isinstance(choice, dict):
        return None
    return {k: choice[k] for k in ("members", "combination", "weights", "in_graph", "validation_loss", "best_member",
                                   "validation_windows", "intervals") if k in choice}
