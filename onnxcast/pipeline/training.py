"""Deterministic training with early stopping on validation loss and epoch/time caps.

Progress: a tqdm bar per model on a terminal, one log line per epoch everywhere else
(Airflow task logs, pipes, CI), decided by :func:`epoch_progress`.

Speed (bench/training.py measures it, windows a second per family): AdamW runs as one fused
kernel (:func:`make_optimizer`), the families in :data:`BF16_FAMILIES` run their training
forward in bfloat16 autocast on CPUs with bf16 units (:func:`bf16_supported`), and a series'
training windows are views of its values (:func:`series_windows`), gathered a batch at a time.
"""

from __future__ import annotations

import copy
import logging
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Protocol, TextIO

import numpy as np
import torch

from onnxcast.pipeline.models import Forecaster

log = logging.getLogger(__name__)


# Families that train in bfloat16 autocast when asked (PipelineConfig.bf16_training) on CPUs with
# bf16 units (AMX or AVX512-BF16). Windows per CPU second against the same step in float32, 1
# thread, batch 64, same run (bench/training.py): the LSTM 3.3x at the example's shapes (lookback
# 168) with one step a time step, 1.5x over patches of 7 (the default since), 1.4-2.1x at an M3
# fleet's (36; oneDNN's bf16 LSTM kernels); the Transformer 0.4-0.45x
# (PyTorch's CPU flash-attention backward is slow in bf16), N-HiTS 0.9x, DLinear 0.7x (the casts
# cost more than the small products save). Not the default: the LSTM's holdout MAE on hourly
# demand was 497 +- 35 over 8 seeds in bf16 against 475 +- 15 in float32 (within seed noise, not
# shown equal); on weekly CO2, +0.2%.
BF16_FAMILIES = ("lstm",)
FLOAT32, BF16_AUTOCAST = "float32", "bfloat16-autocast"


@dataclass
class TrainResult:
    epochs: int
    best_epoch: int
    best_validation_loss: float
    stopped: str  # "early_stopping" | "max_epochs" | "max_minutes"
    seconds: float
    history: list[dict] = field(default_factory=list)
    initial_validation_loss: float | None = None  # epoch 0: the model as built (its anchor)
    precision: str = FLOAT32  # of the training steps: FLOAT32 or BF16_AUTOCAST (validation: float32)

    def to_dict(self) -> dict:
        return asdict(self)


class EpochProgress(Protocol):
    """Told about every finished epoch of one model's training."""

    def epoch(self, epoch: int, train_loss: float, validation_loss: float, best_epoch: int, improved: bool) -> None: ...

    def close(self) -> None: ...


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def bf16_supported() -> bool:
    """Whether this CPU has bfloat16 units (AMX tiles or AVX512-BF16). Without them autocast
    emulates bf16, slower than float32, so training stays float32."""
    try:
        return bool(torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    except AttributeError:  # a torch without these probes: float32
        return False


def train_model(
    model: Forecaster,
    train: tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor],
    validation: tuple[np.ndarray | torch.Tensor, np.ndarray | torch.Tensor],
    *,
    max_epochs: int,
    max_minutes: float,
    patience: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    label: str | None = None,
    progress: EpochProgress | None = None,
    bf16: bool = False,
) -> TrainResult:
    """Train in place with AdamW on MSE in standardised target units; keep the best epoch.

    ``train`` and ``validation`` are ``(history, target)`` windows, numpy arrays or tensors
    (:func:`series_windows` gives views that copy nothing). The same seed, data, thread count
    and CPU kind give the same weights. ``bf16``: the training forward in bfloat16 autocast
    where the CPU has bf16 units (:func:`bf16_supported`), float32 elsewhere; validation is
    always float32. ``label`` names the model in the progress output (default: its family);
    ``progress`` defaults to :func:`epoch_progress`.
    """
    seed_everything(seed)
    x_train, y_train = (torch.as_tensor(a) for a in train)
    x_val, y_val = (torch.as_tensor(a) for a in validation)
    if len(x_train) == 0 or len(x_val) == 0:
        raise ValueError(f"need training and validation windows, got {len(x_train)} and {len(x_val)}")
    generator = torch.Generator().manual_seed(seed)
    return _fit(model, lambda: shuffled_batches(x_train, y_train, batch_size, generator), series_loss,
                lambda: evaluate_loss(model, x_val, y_val, batch_size * 4),
                max_epochs=max_epochs, max_minutes=max_minutes, patience=patience, learning_rate=learning_rate,
                label=label, progress=progress, bf16=bf16)


class BatchSource(Protocol):
    """Draws training windows: what :func:`train_sampled` reads (fleet_train.WindowSampler)."""

    def batch(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def train_sampled(
    model: Forecaster,
    sampler: BatchSource,
    validation: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    windows_per_epoch: int,
    max_epochs: int,
    max_minutes: float,
    patience: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    label: str | None = None,
    progress: EpochProgress | None = None,
    loss: str = "mse",
    bf16: bool = False,
) -> TrainResult:
    """Train in place on windows drawn from ``sampler`` (``windows_per_epoch`` an epoch), on
    the weighted loss :func:`weighted_loss`; the same loop as :func:`train_model` (epoch 0
    competes, patience from the best trained epoch, cosine learning rate, clipped gradients).

    ``validation`` is ``(x, y, w)``, materialised; ``loss`` is the ``kind`` of
    :func:`weighted_loss`; ``bf16`` as in :func:`train_model`. The sampler carries its own
    seeded random state, so a fresh sampler, the same seed, data, threads and CPU kind give the
    same weights.
    """
    if loss not in FLEET_LOSSES:
        raise ValueError(f"fleet loss {loss!r}; expected one of {FLEET_LOSSES}")
    seed_everything(seed)
    x_val, y_val, w_val = (torch.from_numpy(np.ascontiguousarray(a)) for a in validation)
    if len(x_val) == 0 or windows_per_epoch < 1:
        raise ValueError(f"need validation windows and windows per epoch, got {len(x_val)} and {windows_per_epoch}")

    def validation_loss() -> float:
        model.eval()
        total, size = 0.0, batch_size * 4
        with torch.inference_mode():
            for start in range(0, len(x_val), size):
                part = slice(start, start + size)
                total += float(batch_loss(model, x_val[part], y_val[part], w_val[part])) * len(x_val[part])
        return total / len(x_val)

    def batch_loss(model: Forecaster, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return weighted_loss(model, x, y, w, loss)

    return _fit(model, lambda: sampled_batches(sampler, windows_per_epoch, batch_size), batch_loss, validation_loss,
                max_epochs=max_epochs, max_minutes=max_minutes, patience=patience, learning_rate=learning_rate,
                label=label, progress=progress, bf16=bf16)


def series_windows(values: np.ndarray, lookback: int, horizon: int, start: int,
                   end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The windows of :func:`onnxcast.pipeline.data.windows` (stride 1) as views of ``values``:
    ``history [N, lookback, F]`` and ``target [N, horizon]`` share its memory, and a batch
    gathers only its own windows (``data.windows`` copies them all: N x lookback x F floats,
    the series lookback times over)."""
    first = max(start, lookback)
    n = max(end - horizon + 1 - first, 0)
    table = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    history = table.unfold(0, lookback, 1)[first - lookback : first - lookback + n].transpose(1, 2)
    target = table[:, 0].unfold(0, horizon, 1)[first : first + n]
    return history, target


def make_optimizer(model: Forecaster, learning_rate: float) -> torch.optim.AdamW:
    """AdamW (weight decay 1e-4) as one fused kernel a step. PyTorch's CPU default loops over the
    parameters in Python, 5-6 small kernels each. Fused, windows per CPU second, 1 thread, batch
    64 (bench/training.py): LSTM 1.03-1.05x (its recurrence is 97% of a step), Transformer
    1.04-1.18x, DLinear 1.13-1.38x, N-HiTS 1.17-1.32x (~1 M weights). The same update rule, only
    float rounding differs: holdout MAE over 3 seeds unchanged for every family (8 for the LSTM)."""
    return torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=1e-4, fused=True)


def train_step(model: Forecaster, optimizer: torch.optim.Optimizer, batch_loss: Callable[..., torch.Tensor],
               batch: tuple[torch.Tensor, ...], *, bf16: bool = False) -> float:
    """One training step on ``batch``: ``batch_loss(model, *batch)`` (its forward in bfloat16
    autocast when ``bf16``), backward, gradients clipped at norm 1, the optimizer's step.
    Returns the batch's loss."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = batch_loss(model, *batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def shuffled_batches(x: torch.Tensor, y: torch.Tensor, batch_size: int,
                     generator: torch.Generator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of :func:`train_model`: every window once, in a random order, ``batch_size`` at a time."""
    order = torch.randperm(len(x), generator=generator)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        yield x[idx], y[idx]


def sampled_batches(sampler: BatchSource, windows: int, batch_size: int) -> Iterator[tuple[torch.Tensor, ...]]:
    """One epoch of :func:`train_sampled`: ``windows`` drawn from ``sampler``, ``batch_size`` at a time."""
    for start in range(0, windows, batch_size):
        yield tuple(torch.from_numpy(a) for a in sampler.batch(min(batch_size, windows - start)))


def _stop_reason(epoch: int, trained_best_epoch: int, patience: int, deadline: float) -> str | None:
    """Why training stops after ``epoch`` (the time budget first, then patience), or None."""
    if time.monotonic() > deadline:
        return "max_minutes"
    if epoch - trained_best_epoch >= patience:
        return "early_stopping"
    return None


def _fit(
    model: Forecaster,
    next_epoch: Callable[[], Iterable[tuple[torch.Tensor, ...]]],
    batch_loss: Callable[..., torch.Tensor],
    validation_loss: Callable[[], float],
    *,
    max_epochs: int,
    max_minutes: float,
    patience: int,
    learning_rate: float,
    label: str | None,
    progress: EpochProgress | None,
    bf16: bool,
) -> TrainResult:
    """The epoch loop: :func:`train_step` with AdamW, cosine learning rate, the best epoch
    kept. ``next_epoch()`` gives one epoch's batches, ``(x, y, ...)``, each passed to
    ``batch_loss(model, *batch)``; ``bf16`` is honoured where :func:`bf16_supported`."""
    bf16 = bf16 and bf16_supported()
    optimizer = make_optimizer(model, learning_rate)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_epochs, eta_min=learning_rate / 10)
    deadline = time.monotonic() + max_minutes * 60
    started = time.monotonic()
    # Epoch 0 is the model as built, its seasonal-naive anchor. It competes for the final choice
    # (training that never beats it on validation keeps it, and the baseline gate then excludes
    # the family), but patience counts from the best TRAINED epoch: counted from epoch 0, the
    # Transformer on half-hourly demand was stopped at epoch 5 while its validation loss was
    # still falling (0.0445 -> 0.0329), and shipped as the untrained anchor.
    initial_loss = validation_loss()
    best_loss, best_epoch, best_state = initial_loss, 0, copy.deepcopy(model.state_dict())
    trained_best_loss, trained_best_epoch = float("inf"), 0
    history: list[dict] = []
    stopped = "max_epochs"
    if progress is None:
        progress = epoch_progress(max_epochs, family_label(model) if label is None else label)

    try:
        for epoch in range(1, max_epochs + 1):
            train_loss = _train_epoch(model, optimizer, batch_loss, next_epoch(), bf16=bf16, deadline=deadline)
            scheduler.step()
            val_loss = validation_loss()
            history.append({"epoch": epoch, "train_loss": train_loss, "validation_loss": val_loss})
            if val_loss < trained_best_loss - 1e-6:
                trained_best_loss, trained_best_epoch = val_loss, epoch
            improved = val_loss < best_loss - 1e-6
            if improved:
                best_loss, best_epoch, best_state = val_loss, epoch, copy.deepcopy(model.state_dict())
            progress.epoch(epoch, train_loss, val_loss, best_epoch, improved)
            stopped = _stop_reason(epoch, trained_best_epoch, patience, deadline) or stopped
            if stopped != "max_epochs":
                break
    finally:
        progress.close()

    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(epochs=len(history), best_epoch=best_epoch, best_validation_loss=best_loss,
                       stopped=stopped, seconds=time.monotonic() - started, history=history,
                       initial_validation_loss=initial_loss, precision=BF16_AUTOCAST if bf16 else FLOAT32)


def _train_epoch(model: Forecaster, optimizer: torch.optim.Optimizer, batch_loss: Callable[..., torch.Tensor],
                 batches: Iterable[tuple[torch.Tensor, ...]], *, bf16: bool, deadline: float) -> float:
    """One epoch of :func:`train_step` over ``batches`` (cut short at ``deadline``, a
    ``time.monotonic()``); returns the mean training loss per window."""
    model.train()
    total, count = 0.0, 0
    for batch in batches:
        total += train_step(model, optimizer, batch_loss, batch, bf16=bf16) * len(batch[0])
        count += len(batch[0])
        if time.monotonic() > deadline:
            break
    return total / max(count, 1)


def describe(result: TrainResult) -> str:
    """How training ended, for the log: best epoch 0 is spelled out, since it means the model
    shipped is the untrained seasonal-naive anchor."""
    if result.best_epoch == 0:
        tried = min((h["validation_loss"] for h in result.history), default=float("nan"))
        return (f"{result.epochs} epochs ({result.stopped}); best epoch 0, the untrained seasonal-naive anchor: "
                f"no trained epoch beat its validation loss {result.best_validation_loss:.4g} (best trained "
                f"{tried:.4g}), so the model is the baseline and the baseline gate will exclude it")
    return (f"{result.epochs} epochs ({result.stopped}); best epoch {result.best_epoch}: validation loss "
            f"{result.best_validation_loss:.4g}, from {_figure(result.initial_validation_loss)} at epoch 0 "
            "(the untrained seasonal-naive anchor)")


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def evaluate_loss(model: Forecaster, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total = 0.0
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            total += float(series_loss(model, x[start : start + batch_size], y[start : start + batch_size])) * len(x[start : start + batch_size])
    return total / len(x)


def predict(model: Forecaster, history: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """PyTorch forecasts for ``history [N, time, F]`` in raw units."""
    model.eval()
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(history), batch_size):
            outputs.append(model(torch.from_numpy(history[start : start + batch_size])).numpy())
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


def epoch_progress(total: int, label: str, stream: TextIO | None = None) -> EpochProgress:
    """A progress bar on ``stream`` (default stderr) when it is a terminal, else log lines."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        try:
            return ProgressBar(total, label, stream)
        except ImportError:  # tqdm is optional: without it a terminal gets the log lines too
            pass
    return ProgressLines(total, label)


class ProgressLines:
    """One INFO line per epoch through ``logging``: what a log file or a task log should hold."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label

    def epoch(self, epoch: int, train_loss: float, validation_loss: float, best_epoch: int, improved: bool) -> None:
        log.info("%sepoch %d/%d train_loss=%.5f validation_loss=%.5f%s", f"{self.label} " if self.label else "",
                 epoch, self.total, train_loss, validation_loss, " (best)" if improved else "")

    def close(self) -> None:
        pass


class ProgressBar:
    """A tqdm bar over epochs with the latest losses and the best epoch in its postfix."""

    def __init__(self, total: int, label: str, stream: TextIO) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=label or "training", unit="epoch", file=stream, leave=True,
                        dynamic_ncols=True)

    def epoch(self, epoch: int, train_loss: float, validation_loss: float, best_epoch: int, improved: bool) -> None:
        self.bar.set_postfix({"train": f"{train_loss:.4f}", "val": f"{validation_loss:.4f}", "best": best_epoch},
                             refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def family_label(model: Forecaster) -> str:
    """``lstm`` / ``transformer``: the family of a model built by :func:`onnxcast.pipeline.models.build_model`."""
    return type(model.core).__name__.removesuffix("Core").lower()


def series_loss(model: Forecaster, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss of :func:`train_model`: mean squared error in standardised target units."""
    prediction = model(x)
    return torch.mean((model.scaled_target(prediction) - model.scaled_target(y)) ** 2)


FLEET_LOSSES = ("mse", "mae")


def weighted_loss(model: Forecaster, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                  kind: str = "mse") -> torch.Tensor:
    """The fleet loss in raw units, each window's error scaled by its series' weight ``w``
    (``1 / mase_scale``): ``mean(((pred - y) * w) ** 2)``, a squared scaled error, so a series
    counts by how far its forecast is off relative to its own seasonal-naive error, not by its
    level (the pooled-unit loss of :func:`train_model` lets the biggest series own it).
    ``kind="mae"``: ``mean(|pred - y| * w)``, the MASE itself."""
    scaled = (model(x) - y) * w[:, None]
    if kind == "mae":
        return torch.mean(torch.abs(scaled))
    return torch.mean(scaled**2)
