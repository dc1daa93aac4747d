"""Pretraining of the base forecaster on the corpus (onnxcast.pipeline.pretrained.corpus).

A batch: one lookback L for all its windows (drawn from LOOKBACKS, as runs choose them), a
group by GROUP_WEIGHTS and a series in it for each window, an origin in the series; the history
edge-padded before the series start (as fleet windows are); the window normalised exactly as a
WindowForecaster with "recent" normalisation does (level and spread of its newest
``recent_steps(season, L)`` steps, clipped at +-NORM_CLIP); the target in the same units, its
steps past the series end masked. The loss is the mean absolute error in those units.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from onnxcast.pipeline.models import (
    BASE_CONTEXT,
    BASE_HORIZON,
    EPS_FLOOR,
    EPS_RELATIVE,
    NORM_CLIP,
    BaseNet,
    recent_steps,
)
from onnxcast.pipeline.pretrained.corpus import GROUP_WEIGHTS, Corpus

log = logging.getLogger(__name__)

LOOKBACKS = (12, 16, 24, 36, 48, 64, 96, 168)
LOOKBACK_P = (0.08, 0.14, 0.16, 0.2, 0.16, 0.1, 0.1, 0.06)
TARGET_CLIP = 50.0  # per-window units: a target beyond it (a window of near-constant steps) counts as this


def normalise(windows: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(normed, level, spread)`` of ``windows [B, L]`` on each one's newest ``steps[b]`` steps,
    as NormalisedForecaster.normalise with relative_eps (global models)."""
    length = windows.shape[1]
    newest = np.arange(length)[None, :] >= (length - steps)[:, None]
    level = (windows * newest).sum(1) / steps
    var = (((windows - level[:, None]) * newest) ** 2).sum(1) / steps
    spread = np.sqrt(var + EPS_RELATIVE * level * level + EPS_FLOOR)
    normed = np.clip((windows - level[:, None]) / spread[:, None], -NORM_CLIP, NORM_CLIP)
    return normed, level, spread


def anchor_indices(length: int, seasons: np.ndarray, horizon: int = BASE_HORIZON) -> np.ndarray:
    """``[B, horizon]`` indices of the seasonal-naive forecast of each window's season (models.base_anchor_index)."""
    s = np.where((seasons >= 1) & (seasons <= length), seasons, 1)[:, None]
    steps = np.arange(horizon)[None, :]
    return length + steps - s * (steps // s + 1)


class BatchMaker:
    """Seeded batches of pretraining windows from a corpus."""

    def __init__(self, corpus: Corpus, seed: int):
        self.rng = np.random.default_rng(seed)
        self.groups = [g for g in GROUP_WEIGHTS if corpus.series.get(g)]
        weights = np.array([GROUP_WEIGHTS[g] for g in self.groups])
        self.group_p = weights / weights.sum()
        self.corpus = corpus

    def window(self, length: int) -> tuple[np.ndarray, np.ndarray, int]:
        """One ``(history [length], target [BASE_HORIZON] with NaN past the end, season)``."""
        rng = self.rng
        group = self.groups[int(rng.choice(len(self.groups), p=self.group_p))]
        index = int(rng.integers(len(self.corpus.series[group])))
        values, season = self.corpus.series[group][index], self.corpus.seasons[group][index]
        n = len(values)
        low = min(max(2, season), n - 1)
        origin = int(rng.integers(low, n))  # history ends before it, at least one target step
        rows = np.maximum(np.arange(origin - length, origin), 0)
        target = np.full(BASE_HORIZON, np.nan)
        future = values[origin : origin + BASE_HORIZON]
        target[: len(future)] = future
        if rng.random() < 0.1:
            season = 1
        return values[rows], target, season

    def batch(self, size: int) -> tuple[torch.Tensor, ...]:
        """``(context [B, C], mask [B, C], anchor [B, H], target [B, H], valid [B, H])`` as float32 tensors."""
        length = int(self.rng.choice(LOOKBACKS, p=LOOKBACK_P))
        parts = [self.window(length) for _ in range(size)]
        windows = np.stack([p[0] for p in parts])
        targets = np.stack([p[1] for p in parts])
        seasons = np.array([p[2] for p in parts])
        seasons = np.where(seasons <= length, seasons, 1)
        steps = np.array([recent_steps(int(s), length) for s in seasons])
        normed, level, spread = normalise(windows, steps)
        anchor = np.take_along_axis(normed, anchor_indices(length, seasons), axis=1)
        valid = np.isfinite(targets)
        target = np.clip((np.nan_to_num(targets) - level[:, None]) / spread[:, None], -TARGET_CLIP, TARGET_CLIP)
        keep = min(length, BASE_CONTEXT)
        context = np.zeros((size, BASE_CONTEXT))
        context[:, BASE_CONTEXT - keep:] = normed[:, length - keep:]
        mask = np.zeros((size, BASE_CONTEXT))
        mask[:, BASE_CONTEXT - keep:] = 1.0
        return tuple(torch.from_numpy(a.astype(np.float32)) for a in (context, mask, anchor, target * valid, valid))


def masked_mae(net: BaseNet, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    context, mask, anchor, target, valid = batch
    error = (net(context, mask, anchor) - target).abs() * valid
    return error.sum() / valid.sum().clamp_min(1.0)


def pretrain(corpus: Corpus, *, steps: int, batch_size: int, learning_rate: float, seed: int,
             threads: int = 2, log_every: int = 100) -> tuple[BaseNet, dict]:
    """Train a fresh BaseNet for ``steps`` steps (AdamW, linear warm-up then cosine decay, gradients
    clipped at 1); returns ``(net, {"training_seconds", "final_loss", ...})``."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    net = BaseNet()
    batches = BatchMaker(corpus, seed + 1)
    optimizer = torch.optim.AdamW(net.parameters(), lr=learning_rate, weight_decay=1e-4)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, (k + 1) / warmup) * 0.5 * (1 + np.cos(np.pi * min(k, steps) / steps)))
    started, running = time.monotonic(), []
    for step in range(steps):
        loss = masked_mae(net, batches.batch(batch_size))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        running.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            log.info("step %d/%d: loss %.4f (%.0f s)", step + 1, steps, np.mean(running[-log_every:]),
                     time.monotonic() - started)
    seconds = time.monotonic() - started
    return net, {"training_seconds": round(seconds, 1), "final_loss": round(float(np.mean(running[-log_every:])), 5),
                 "parameters": sum(p.numel() for p in net.parameters())}
