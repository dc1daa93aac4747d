"""Training, one step for one series or many (:func:`train_global`); for many, one global
model per family trained on windows drawn from every series of a fleet.

Windows are drawn lazily (:class:`WindowSampler`: a series, then an origin in its training
segment, the history gathered from the flat values array and edge-padded before the series
start), never all materialised. The model is built with the identity scaler (the per-window
normalisation inside the graph makes it scale-free; a pooled scaler flattens the windows of
small series, docs/design/fleet.md finding 1) and the loss weighs each window by
``1 / mase_scale`` of its series, so big series do not own it.

Design: docs/design/fleet.md section 3.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from onnxcast.base.errors import DataError
from onnxcast.pipeline.checkpoint import save_model
from onnxcast.pipeline.config import PATCHED_FAMILIES, PipelineConfig
from onnxcast.pipeline.fleet_data import (
    FleetData,
    FleetSplit,
    load_split,
)
from onnxcast.pipeline.judging import ACROSS_SERIES, judging_for
from onnxcast.pipeline.metrics import mase_scale, seasonal_naive
from onnxcast.pipeline.pretrained.weights import load_weights, summary
from onnxcast.pipeline.seasons import model_seasons, seasons_for_freq

log = logging.getLogger(__name__)

ANCHOR_SAMPLE = 500  # series whose training segments choose the fleet's anchor season
ANCHOR_ORIGINS = 2000  # about how many origins of one series judge a candidate anchor season
# the weighted loss (training.weighted_loss): "mse", a squared scaled error, or "mae", the MASE
FLEET_LOSS = "mse"
# the base forecaster is fine-tuned at this share of the learning rate: small steps from the shipped
# weights (epoch 0, the pretrained model, competes on the validation loss either way)
BASE_LEARNING_RATE_FACTOR = 0.1
ZERO_SHOT = "zero_shot"  # TrainResult.stopped of a base model used as shipped


def series_weights(fleet: FleetData, split: FleetSplit, season: int) -> np.ndarray:
    """``1 / mase_scale`` of every series' training segment (float32): the loss weight that
    makes a window's error a scaled error, comparable across series of any level."""
    scales = np.array([mase_scale(np.asarray(fleet.target(i)[: split.train_end[i]], dtype=np.float64), season)
                       for i in range(fleet.n_series)])
    return (1.0 / scales).astype(np.float32)


def gather(fleet: FleetData, series: np.ndarray, origins: np.ndarray, lookback: int,
           horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Histories ``[n, lookback, F]`` ending before ``origins`` (relative to each series) and
    the targets ``[n, horizon]`` from there, gathered from the flat values array. Histories
    that reach before the series start repeat its first row (edge padding): a short series
    still gives windows, and the targets are always real points."""
    start = fleet.offsets[series][:, None]
    rows = start + origins[:, None] + np.arange(-lookback, 0)[None, :]
    x = fleet.values[np.maximum(rows, start)]
    y = fleet.values[start + origins[:, None] + np.arange(horizon)[None, :], 0]
    return np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.float32)


class WindowSampler:
    """Training windows drawn lazily from a fleet: a series, then an origin (the end of the
    history) in its training segment.

    Per series the origins run from ``min_context`` (at least ``season``, at least 1: the
    seasonal anchor reads one real season) to ``train_end - horizon``, so targets never reach
    the validation segment. A series is drawn with probability ∝ ``n_origins ** power``
    (0: every series alike, 1: every window alike); series without an origin are never drawn
    (the data gate excludes them, ``train_too_short``). Memory per call is one batch.
    """

    def __init__(self, fleet: FleetData, split: FleetSplit, lookback: int, horizon: int, *, season: int,
                 power: float, seed: int):
        self.fleet, self.lookback, self.horizon = fleet, int(lookback), int(horizon)
        self.min_context = max(int(season), 1)
        self.n_origins = np.maximum(np.asarray(split.train_end, dtype=np.int64) - self.horizon
                                    - self.min_context + 1, 0)
        usable = self.n_origins > 0
        if not usable.any():
            raise DataError(f"no series has a training window: every training segment is shorter than "
                            f"{self.min_context + self.horizon} steps (a season of context plus the horizon)")
        if not usable.all():
            log.warning("%d of %d series are too short for a training window and are not drawn",
                        int((~usable).sum()), fleet.n_series)
        p = np.where(usable, self.n_origins.astype(np.float64) ** float(power), 0.0)
        self.p = p / p.sum()
        # Generator.choice(p=...) checks and sums p on every call, O(series) a batch: 0.1 ms at
        # 10,000 series, 11 ms at 1,000,000 (an N-HiTS step is ~25 ms). Its own steps with the
        # cumulative sum made once (draw): the same draws, bit for bit, in 0.01-0.08 ms.
        self.cdf = np.cumsum(self.p)
        self.cdf /= self.cdf[-1]
        self.weights = series_weights(fleet, split, season)
        self.rng = np.random.default_rng(seed)

    def draw(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        """``size`` (series, origin) pairs: a series by ``p``, then one of its origins uniformly."""
        s = self.cdf.searchsorted(self.rng.random(size), side="right")
        o = self.min_context + np.floor(self.rng.random(size) * self.n_origins[s]).astype(np.int64)
        return s, o

    def batch(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``x`` float32 ``[size, lookback, F]``, ``y`` float32 ``[size, horizon]``, ``w``
        float32 ``[size]``."""
        s, o = self.draw(size)
        x, y = gather(self.fleet, s, o, self.lookback, self.horizon)
        return x, y, self.weights[s]


def validation_windows(fleet: FleetData, split: FleetSplit, lookback: int, horizon: int, *, season: int,
                       max_series: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The validation window of up to ``max_series`` series (a seeded sample): the last
    ``horizon`` steps before ``validation_end``, end-aligned, the history edge-padded like the
    training windows; ``(x, y, w)`` materialised (2,000 series x 36 steps: 0.3 MB)."""
    origins = np.asarray(split.validation_end, dtype=np.int64) - horizon
    eligible = np.flatnonzero(origins >= max(int(season), 1))
    if len(eligible) == 0:
        raise DataError("no series has a validation window")
    if len(eligible) > max_series:
        eligible = np.sort(np.random.default_rng(seed).choice(eligible, max_series, replace=False))
    x, y = gather(fleet, eligible, origins[eligible], lookback, horizon)
    return x, y, series_weights(fleet, split, season)[eligible]


def anchor_season(fleet: FleetData, split: FleetSplit, seasons: tuple[int, ...], horizon: int, lookback: int, *,
                  sample: int = ANCHOR_SAMPLE, seed: int = 0) -> int:
    """Among ``seasons`` that fit the lookback, the one whose seasonal-naive forecast had the
    lowest mean SCALED MAE over the training segments of a seeded sample of series: what the
    models start from (weekly beats daily on most hourly demand; only training data is looked
    at). Ties go to the shorter season. A series judges on at most ``ANCHOR_ORIGINS`` evenly
    spaced origins (a long single series, 100,000 hourly rows, need not be read whole). One
    series is a fleet of one: its own scale cancels and the lowest MAE wins."""
    candidates = sorted({s for s in seasons if 1 <= s <= lookback} or {1})
    if len(candidates) == 1:
        return candidates[0]
    index = np.arange(fleet.n_series)
    if len(index) > sample:
        index = np.sort(np.random.default_rng(seed).choice(index, sample, replace=False))
    scores = {}
    for season in candidates:
        steps = np.arange(horizon)
        first = int((season * (steps // season + 1)).max())
        scaled = []
        for i in index:
            target = np.asarray(fleet.target(i)[: split.train_end[i]], dtype=np.float64)
            origins = np.arange(first, len(target) - horizon + 1)
            origins = origins[:: max(1, len(origins) // ANCHOR_ORIGINS)]
            if len(origins):
                actual = target[origins[:, None] + steps[None, :]]
                error = np.abs(seasonal_naive(target, origins, horizon, season) - actual).mean()
                scaled.append(error / mase_scale(target, fleet.season))
        scores[season] = float(np.mean(scaled)) if scaled else float("inf")
    return min(candidates, key=lambda s: scores[s])


def train_global(cfg: PipelineConfig, family: str) -> dict:
    """Train ``family`` on the series in ``data/fleet/``, one or many; save model.pt and
    model.json; return ``{"family", "epochs", "best_validation_loss"}``.

    One step for any number of series; what the sample supports picks the windows
    (:func:`onnxcast.pipeline.judging.judging_for`). Judged across series: one
    global model (``global_model`` true, the identity scaler) on windows drawn across the
    series (:class:`WindowSampler`), each weighed by its series' ``1 / mase_scale``, stopped on
    one validation window per series. Judged over origins (one series): every window of the
    training segment an epoch, the scaler of the training rows, stopped on every validation
    window. Both start from the seasonal-naive forecast of :func:`anchor_season`, unless the
    settings name a season; the window families also mix in the others."""
    from onnxcast.pipeline.models import ModelSpec, never_negative, torch_threads
    from onnxcast.pipeline.training import describe

    fleet, split = load_split(cfg.layout.fleet, cfg)
    across = judging_for(fleet.n_series) == ACROSS_SERIES
    implied = seasons_for_freq(fleet.freq)
    anchor = fleet.season if cfg.season else anchor_season(
        fleet, split, (fleet.season, *implied), cfg.horizon, cfg.lookback, seed=cfg.seed)
    spec = ModelSpec(family=family, n_features=fleet.n_features, horizon=cfg.horizon, lookback=cfg.lookback,
                     hidden_size=cfg.hidden_size, num_layers=cfg.num_layers, d_model=cfg.d_model,
                     n_heads=cfg.n_heads, patch=cfg.sequence_patch if family in PATCHED_FAMILIES else 1,
                     season=anchor, seasons=model_seasons(anchor, implied, cfg.lookback),
                     nonnegative=never_negative(fleet.values[:, 0], fleet.offsets, split.train_end),
                     # across series: the window's newest steps set its level and spread, so a level
                     # shift inside the window no longer sets the forecast's scale (issue 32)
                     **({"global_model": True, "n_series": fleet.n_series, "normalisation": "recent"}
                        if across else {}))
    if family == "base":  # the pretrained net reads windows normalised on their newest steps, in any run
        spec = dataclasses.replace(spec, normalisation="recent")
    log.info("%s anchors on the seasonal-naive forecast of period %d%s", family, anchor,
             f" (and mixes in {list(spec.anchor_seasons[1:])})" if len(spec.anchor_seasons) > 1 else "")
    fit = _fit_base if family == "base" else _fit_across_series if across else _fit_every_window
    # cfg.threads (default 1): two OpenMP threads per task made epochs up to 30x slower when
    # another task shared the two cores (docs/performance.md)
    with torch_threads(cfg.threads):
        model, result, extra = fit(cfg, family, spec, fleet, split)
    if family == "base" and result.best_epoch == 0:  # epoch 0 is the pretrained model, not the seasonal naive
        how = "zero-shot, the shipped weights" + ("" if result.stopped == ZERO_SHOT else
                                                  f" (no fine-tuned epoch of {result.epochs} beat them)")
    else:
        how = describe(result)
    log.info("trained %s in %.1fs (%s): %s", family, result.seconds, result.precision, how)
    save_model(cfg, family, model, spec, {"source": "trained", "training": result.to_dict(), **extra})
    return {"family": family, "epochs": result.epochs, "best_validation_loss": result.best_validation_loss}


def _fit_base(cfg: PipelineConfig, family: str, spec, fleet: FleetData, split: FleetSplit):
    """``(model, result, model.json extras)`` of the pretrained base forecaster: the shipped weights
    (onnxcast.pipeline.pretrained.weights), fine-tuned for ``base_finetune_minutes`` at
    BASE_LEARNING_RATE_FACTOR x the learning rate (epoch 0, the pretrained model, competes), or
    zero-shot when that is 0 or the data hold no training or validation window."""
    from onnxcast.pipeline.models import build_model
    from onnxcast.pipeline.training import TrainResult

    state, provenance = load_weights()
    model = build_model(spec)
    model.core.net.load_state_dict(state)
    extra = {"pretrained": summary(provenance)}
    if cfg.base_finetune_minutes > 0:
        tuning = dataclasses.replace(cfg, max_minutes=cfg.base_finetune_minutes,
                                     learning_rate=cfg.learning_rate * BASE_LEARNING_RATE_FACTOR)
        fit = _fit_across_series if judging_for(fleet.n_series) == ACROSS_SERIES else _fit_every_window
        try:
            tuned, result, more = fit(tuning, family, spec, fleet, split, start=model)
            return tuned, result, {**more, **extra, "use": "fine-tuned"}
        except (DataError, ValueError) as exc:  # no training or validation window
            log.info("base: no fine-tuning (%s): the pretrained model, zero-shot", exc)
    result = TrainResult(epochs=0, best_epoch=0, best_validation_loss=None, stopped=ZERO_SHOT, seconds=0.0)
    return model, result, {**extra, "use": "zero-shot"}


def _fit_across_series(cfg: PipelineConfig, family: str, spec, fleet: FleetData, split: FleetSplit, start=None):
    """``(model, result, model.json extras)`` of a global model on windows drawn across the series
    (``start``: from this model, else a fresh one)."""
    from onnxcast.pipeline.models import build_model
    from onnxcast.pipeline.training import BF16_FAMILIES, seed_everything, train_sampled

    sampler = WindowSampler(fleet, split, cfg.lookback, cfg.horizon, season=spec.season,
                            power=cfg.series_sampling_power, seed=cfg.seed)
    validation = validation_windows(fleet, split, cfg.lookback, cfg.horizon, season=spec.season,
                                    max_series=cfg.fleet_validation_series, seed=cfg.seed)
    seed_everything(cfg.seed)
    # the identity scaler: per-window normalisation alone (finding 1 of docs/design/fleet.md)
    model = start if start is not None else build_model(spec, np.zeros(fleet.n_features), np.ones(fleet.n_features))
    log.info("training global %s on %d series: %d windows an epoch, validation %d series, up to %d epochs / "
             "%.1f min", family, fleet.n_series, cfg.fleet_windows_per_epoch, len(validation[0]), cfg.max_epochs,
             cfg.max_minutes)
    result = train_sampled(model, sampler, validation, windows_per_epoch=cfg.fleet_windows_per_epoch,
                           max_epochs=cfg.max_epochs, max_minutes=cfg.max_minutes, patience=cfg.patience,
                           batch_size=cfg.batch_size, learning_rate=cfg.learning_rate, seed=cfg.seed,
                           loss=FLEET_LOSS, bf16=cfg.bf16_training and family in BF16_FAMILIES)
    extra = {"fleet": {"series": fleet.n_series, "windows_per_epoch": cfg.fleet_windows_per_epoch,
                       "power": cfg.series_sampling_power, "loss": FLEET_LOSS}}
    return model, result, extra


def _fit_every_window(cfg: PipelineConfig, family: str, spec, fleet: FleetData, split: FleetSplit, start=None):
    """``(model, result, {})`` of a model on every window of one series (series 0; ``start``: from
    this model, else a fresh one)."""
    from onnxcast.pipeline.models import build_model
    from onnxcast.pipeline.training import (
        BF16_FAMILIES,
        seed_everything,
        series_windows,
        train_model,
    )

    values = fleet.series(0)
    train_end, validation_end = int(split.train_end[0]), int(split.validation_end[0])
    # views of the series, not copies of every window (a batch gathers its own)
    train = series_windows(values, cfg.lookback, cfg.horizon, 0, train_end)
    validation = series_windows(values, cfg.lookback, cfg.horizon, train_end, validation_end)
    seed_everything(cfg.seed)
    train_rows = values[:train_end]
    model = start if start is not None else build_model(spec, train_rows.mean(axis=0), train_rows.std(axis=0))
    log.info("training %s on %d windows (validation %d), up to %d epochs / %.1f min",
             family, len(train[0]), len(validation[0]), cfg.max_epochs, cfg.max_minutes)
    result = train_model(model, train, validation, max_epochs=cfg.max_epochs, max_minutes=cfg.max_minutes,
                         patience=cfg.patience, batch_size=cfg.batch_size, learning_rate=cfg.learning_rate,
                         seed=cfg.seed, bf16=cfg.bf16_training and family in BF16_FAMILIES)
    return model, result, {}
