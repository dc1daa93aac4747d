"""LSTM and Transformer-encoder forecasters: ``history [batch, time, n_features]`` (raw units)
-> ``forecast [batch, horizon]`` (raw units).

Scaling lives inside the module (and so inside the ONNX graph): a global standard scaler
fitted on the training segment, then per-window normalisation (RevIN without affine
parameters), which keeps the models honest on trending series whose holdout level was
never seen in training. Both cores accept any history length: nothing depends on ``time``
being the training ``lookback``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

EPS = 1e-5


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a trained model from its state dict (saved as JSON)."""

    family: str
    n_features: int
    horizon: int
    lookback: int
    hidden_size: int = 64
    num_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    season: int = 1  # the core forecasts a correction to the seasonal-naive forecast

    def to_dict(self) -> dict:
        return asdict(self)


def build_model(spec: ModelSpec, mean: np.ndarray | None = None, std: np.ndarray | None = None) -> Forecaster:
    """A fresh model for ``spec``; ``mean``/``std`` are the training-segment column statistics."""
    if spec.family == "lstm":
        core: nn.Module = LSTMCore(spec.n_features, spec.hidden_size, spec.num_layers, spec.horizon)
    elif spec.family == "transformer":
        core = TransformerCore(spec.n_features, spec.d_model, spec.n_heads, spec.num_layers, spec.horizon)
    else:
        raise ValueError(f"unknown model family {spec.family!r}; expected 'lstm' or 'transformer'")
    return Forecaster(core, spec.n_features, spec.season, mean, std)


class Forecaster(nn.Module):
    """Wraps a core with the folded scaler, per-window normalisation and a seasonal anchor.

    The core predicts a correction to the seasonal-naive forecast read from the history
    (``y[t + h - season * (h // season + 1)]``), so an untrained model starts at the
    baseline and training only has to learn what the baseline misses. This needs
    ``time >= season``.
    """

    def __init__(self, core: nn.Module, n_features: int, season: int, mean: np.ndarray | None, std: np.ndarray | None):
        super().__init__()
        self.core = core
        horizon = core.head.out_features
        steps = torch.arange(horizon)
        self.register_buffer("anchor_offset", steps - season * (steps // season + 1))
        mean_t = torch.zeros(n_features) if mean is None else torch.as_tensor(mean, dtype=torch.float32)
        std_t = torch.ones(n_features) if std is None else torch.as_tensor(std, dtype=torch.float32)
        self.register_buffer("feature_mean", mean_t.reshape(1, 1, n_features).clone())
        self.register_buffer("feature_std", std_t.clamp_min(EPS).reshape(1, 1, n_features).clone())

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        scaled = (history - self.feature_mean) / self.feature_std
        level = scaled.mean(dim=1, keepdim=True)
        spread = torch.sqrt(scaled.var(dim=1, keepdim=True, unbiased=False) + EPS)
        normed = (scaled - level) / spread
        anchor = normed[:, :, 0].index_select(1, self.anchor_offset + history.shape[1])
        out = anchor + self.core(normed)  # [batch, horizon], in per-window units of the target
        out = out * spread[:, :, 0] + level[:, :, 0]
        return out * self.feature_std[:, :, 0] + self.feature_mean[:, :, 0]

    def scaled_target(self, target: torch.Tensor) -> torch.Tensor:
        """Target in globally standardised units (the unit of the training loss)."""
        return (target - self.feature_mean[:, 0, :1]) / self.feature_std[:, 0, :1]


class LSTMCore(nn.Module):
    def __init__(self, n_features: int, hidden: int, layers: int, horizon: int):
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The last layer's final hidden state (the same numbers as ``out[:, -1]``): read from
        # the LSTM op's Y_h output, its per-step output Y becomes unused, so ONNX Runtime does
        # not write and transpose [time, batch, hidden] of it (see onnxcast.optimize).
        _, (hidden, _) = self.lstm(x)
        return self.head(hidden[-1])


class TransformerCore(nn.Module):
    """Encoder-only Transformer with sinusoidal positions counted back from the newest step.

    Attention is written out (not nn.MultiheadAttention) so the export stays dynamic in
    batch and time and has the MatMul-Softmax-MatMul shape that ORT's fusions recognise.
    """

    def __init__(self, n_features: int, d_model: int, n_heads: int, layers: int, horizon: int):
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Linear(n_features, d_model)
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(2 * d_model, horizon)
        inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time = x.shape[1]
        # position 0 is the newest step, so a longer history only adds older positions
        position = torch.arange(time - 1, -1, -1, dtype=torch.float32, device=x.device).unsqueeze(1)
        angle = position * self.inv_freq
        h = self.embed(x) + torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        return self.head(torch.cat([h[:, -1], h.mean(dim=1)], dim=-1))


class EncoderLayer(nn.Module):
    """Post-norm encoder layer (BERT layout): attention, add & norm, feed-forward, add & norm."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, 2 * d_model)
        self.ff2 = nn.Linear(2 * d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, d_model = x.shape
        q = self._heads(self.query(x), batch, time)
        k = self._heads(self.key(x), batch, time)
        v = self._heads(self.value(x), batch, time)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        context = context.transpose(1, 2).reshape(batch, time, d_model)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))

    def _heads(self, t: torch.Tensor, batch: int, time: int) -> torch.Tensor:
        return t.reshape(batch, time, self.n_heads, self.head_dim).transpose(1, 2)
