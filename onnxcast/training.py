"""Deterministic training with early stopping on validation loss and epoch/time caps."""

from __future__ import annotations

import copy
import logging
import random
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from onnxcast.models import Forecaster

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    epochs: int
    best_epoch: int
    best_validation_loss: float
    stopped: str  # "early_stopping" | "max_epochs" | "max_minutes"
    seconds: float
    history: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train_model(
    model: Forecaster,
    train: tuple[np.ndarray, np.ndarray],
    validation: tuple[np.ndarray, np.ndarray],
    *,
    max_epochs: int,
    max_minutes: float,
    patience: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
) -> TrainResult:
    """Train in place with AdamW on MSE in standardised target units; keep the best epoch.

    The same seed, data and thread count give the same weights.
    """
    seed_everything(seed)
    x_train, y_train = (torch.from_numpy(a) for a in train)
    x_val, y_val = (torch.from_numpy(a) for a in validation)
    if len(x_train) == 0 or len(x_val) == 0:
        raise ValueError(f"need training and validation windows, got {len(x_train)} and {len(x_val)}")
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max_epochs, eta_min=learning_rate / 10)
    generator = torch.Generator().manual_seed(seed)
    deadline = time.monotonic() + max_minutes * 60
    started = time.monotonic()
    best_loss, best_epoch, best_state = float("inf"), 0, copy.deepcopy(model.state_dict())
    history: list[dict] = []
    stopped = "max_epochs"

    for epoch in range(1, max_epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), generator=generator)
        total, count = 0.0, 0
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            loss = _loss(model, x_train[idx], y_train[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            total += loss.item() * len(idx)
            count += len(idx)
            if time.monotonic() > deadline:
                break
        scheduler.step()
        val_loss = evaluate_loss(model, x_val, y_val, batch_size * 4)
        history.append({"epoch": epoch, "train_loss": total / max(count, 1), "validation_loss": val_loss})
        improved = val_loss < best_loss - 1e-6
        if improved:
            best_loss, best_epoch, best_state = val_loss, epoch, copy.deepcopy(model.state_dict())
        log.info("epoch %d/%d train_loss=%.5f validation_loss=%.5f%s", epoch, max_epochs,
                 total / max(count, 1), val_loss, " (best)" if improved else "")
        if time.monotonic() > deadline:
            stopped = "max_minutes"
            break
        if epoch - best_epoch >= patience:
            stopped = "early_stopping"
            break

    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(epochs=len(history), best_epoch=best_epoch, best_validation_loss=best_loss,
                       stopped=stopped, seconds=time.monotonic() - started, history=history)


def evaluate_loss(model: Forecaster, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total = 0.0
    with torch.inference_mode():
        for start in range(0, len(x), batch_size):
            total += float(_loss(model, x[start : start + batch_size], y[start : start + batch_size])) * len(x[start : start + batch_size])
    return total / len(x)


def predict(model: Forecaster, history: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """PyTorch forecasts for ``history [N, time, F]`` in raw units."""
    model.eval()
    outputs = []
    with torch.inference_mode():
        for start in range(0, len(history), batch_size):
            outputs.append(model(torch.from_numpy(history[start : start + batch_size])).numpy())
    return np.concatenate(outputs) if outputs else np.zeros((0, 0), np.float32)


def _loss(model: Forecaster, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    prediction = model(x)
    return torch.mean((model.scaled_target(prediction) - model.scaled_target(y)) ** 2)
