"""The forms the exporter traces: the trained model's function, written in fewer and cheaper
ONNX ops.

A trained forecaster is written for training: the global scaler, the per-window normalisation,
the seasonal anchors picked by ``index_select`` and mixed by a broadcast product, the
correction head reading them. Exported as written, that preamble was most of a DLinear or
N-HiTS forecast: at batch 64 DLinear's one ``AveragePool`` (its moving average) took 260 us and
five ``Gather`` nodes 100 us of a 0.9 ms run whose three ``Gemm`` took 28 us (ORT profiler,
docs/performance.md). :func:`graph_form` returns a module with the same function, arranged for
ONNX Runtime:

- Normalisation in raw units: ``normed = (x - mean) / sqrt(var + eps * std**2)``, which is the
  model's ``((x - m) / s - level) / spread`` with the global scaler cancelled out (it remains
  only in ``eps``), and the forecast goes back as ``out * spread + mean``.
- The anchors (each period's seasonal-naive forecast) are Slices of the newest steps instead of
  a ``Gather``, and their mix one MatMul; for the LSTM and the Transformer the mix and the
  head's anchor columns are one matrix: ``anchors @ (mix + head_anchor_weights)``.
- **DLinear is linear** from the normalised window to its normalised forecast (moving
  average, both maps, the anchors and their mix): the whole core folds into one matrix
  ``A [lookback * F, horizon]`` and a bias, found by evaluating the trained model's own
  ``forecast_normed`` on a basis in float64 and checked on random windows before use.
- The Transformer's sinusoidal positions are one ``Sin`` (``cos x = sin(x + pi / 2)``), and its
  attention the explicit products that ``fuse_attention`` turns into one ``Attention`` op.

The eager model stays as trained: it is the PyTorch reference the parity gate compares every
exported variant with (several batch sizes and history lengths), so a form that drifted from
the model fails the run.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from onnxcast.pipeline.intervals import SCALE_EPS_RELATIVE, SCALE_FLOOR
from onnxcast.pipeline.models import (
    EPS,
    EPS_FLOOR,
    EPS_RELATIVE,
    NORM_CLIP,
    DLinearCore,
    EncoderLayer,
    EnsembleForecaster,
    Forecaster,
    LSTMCore,
    NormalisedForecaster,
    QuantileOutput,
    TransformerCore,
    WindowForecaster,
)

# Constant matrices that pick or add values exactly (a Gather, a broadcast mix, the quantiles'
# offsets as MatMuls): kept in float by dynamic INT8 (onnxcast.pipeline.optimize.exact_products).
EXACT_MATRICES = ("mix", "anchor_map", "quantile_map")
# A fold is used only when it reproduces the model: largest difference on random windows,
# relative to the forecast's scale, in float64 (seen: ~1e-15).
FOLD_TOLERANCE = 1e-9


def graph_form(model: QuantileOutput) -> nn.Module:
    """The module to export for ``model``: ``history -> forecast`` or, with quantile offsets,
    ``history -> (forecast, quantiles)``."""
    if isinstance(model, EnsembleForecaster):
        return EnsembleForm(model)
    if isinstance(model, WindowForecaster):
        if isinstance(model.core, DLinearCore):
            return FoldedLinearForm(model)
        return WindowForm(model)
    if isinstance(model, Forecaster) and isinstance(model.core, (LSTMCore, TransformerCore)):
        return SequenceForm(model)
    raise TypeError(f"no export form for {type(model).__name__} with {type(model.core).__name__}")


class _Form(nn.Module):
    """The shared preamble and postamble: the window as rows of one feature each
    (``[batch, F, time]``, so every reduction runs along the last, contiguous axis; a single
    feature is only reshaped), raw-unit normalisation, unscaling, quantiles."""

    def __init__(self, model: NormalisedForecaster, window: int | None):
        super().__init__()
        self.window = window  # the newest steps the forecast reads (None: all)
        self.n_features = int(model.feature_mean.shape[-1])
        self.relative_eps = bool(model.relative_eps)
        self.norm_steps = int(model.norm_steps)  # "recent" normalisation: level and spread of the newest steps
        mean = model.feature_mean.detach().reshape(1, -1, 1).clone()
        std = model.feature_std.detach().reshape(1, -1, 1).clone()
        self.register_buffer("feature_mean", mean)
        if self.relative_eps:  # var + e_r * (level - m)**2 + e_f * s**2, all in raw units
            self.register_buffer("eps", EPS_FLOOR * std * std)
        else:  # var + EPS * s**2
            self.register_buffer("eps", EPS * std * std)
        self.init_outputs(model, window)
        if hasattr(model, "min_history"):
            self.min_history = model.min_history  # the exporter's lower bound of the time axis

    def init_outputs(self, model: QuantileOutput, window: int | None) -> None:
        """What :meth:`outputs` reads: the clip at 0, the quantiles' map and the interval scale's
        lag and window."""
        self.nonnegative = bool(model.nonnegative)  # a Relu after each output, as the model's
        self.with_quantiles = bool(model.has_quantiles)
        if self.with_quantiles:
            offsets = model.quantile_offsets.detach()
            horizon, self.n_levels = (int(n) for n in offsets.shape)
            self.horizon_steps = horizon
            quantile_map = torch.zeros(horizon + 1, horizon * self.n_levels)
            for h in range(horizon):
                quantile_map[h, h * self.n_levels : (h + 1) * self.n_levels] = 1.0
            quantile_map[horizon] = offsets.reshape(-1)
            self.register_buffer("quantile_map", quantile_map)
        self.interval_lag = int(model.interval_lag)
        self.interval_lookback = int(window or model.interval_lookback)

    def rows(self, history: torch.Tensor) -> torch.Tensor:
        """The (window of the) history as ``[batch, F, time]``."""
        window = history if self.window is None else history[:, -self.window:]
        if self.n_features == 1:
            return window.squeeze(2).unsqueeze(1)
        return window.transpose(1, 2)

    def target(self, rows: torch.Tensor) -> torch.Tensor:
        """The target's row ``[batch, time]``."""
        return rows.squeeze(1) if self.n_features == 1 else rows[:, 0]

    def normalise(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(centered [B, F, T], level [B, F, 1], spread [B, F, 1])`` in raw units; the
        normalised window is ``centered / spread`` (:meth:`scaled`). Level and spread are the
        whole window's, or (``norm_steps``) its newest steps'."""
        if self.norm_steps:
            basis = rows[:, :, -self.norm_steps:]
            level = basis.mean(dim=-1, keepdim=True)
            deviation = basis - level
            var = (deviation * deviation).mean(dim=-1, keepdim=True) + self.eps
            centered = rows - level
        else:
            level = rows.mean(dim=-1, keepdim=True)
            centered = rows - level
            var = (centered * centered).mean(dim=-1, keepdim=True) + self.eps
        if self.relative_eps:
            shifted = level - self.feature_mean
            var = var + EPS_RELATIVE * shifted * shifted
        return centered, level, torch.sqrt(var)

    def scaled(self, centered: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
        """The normalised window, clipped at +-NORM_CLIP under the "recent" normalisation (as
        NormalisedForecaster.normalise)."""
        normed = centered / spread
        return normed.clamp(-NORM_CLIP, NORM_CLIP) if self.norm_steps else normed

    def outputs(self, raw_target: torch.Tensor, forecast: torch.Tensor):
        """``forecast`` (and ``quantiles``): the raw target row ``[B, time]`` is the interval
        scale's window. A ``nonnegative`` model's outputs are clipped at 0 (a Relu each), as the
        model's (NormalisedForecaster.unscale, QuantileOutput.forecast_and_quantiles)."""
        if self.nonnegative:
            forecast = torch.relu(forecast)
        if not self.with_quantiles:
            return forecast
        window = raw_target if self.interval_lookback == self.window else raw_target[:, -self.interval_lookback:]
        lag = self.interval_lag
        # (ReduceL1 / ReduceL2 would save a pass each, but onnxruntime's symbolic shape inference,
        # which int8 quantization runs, gives them no shape at opset 18)
        scale = ((window[:, lag:] - window[:, :-lag]).abs().mean(dim=1, keepdim=True)
                 + SCALE_EPS_RELATIVE * window.abs().mean(dim=1, keepdim=True) + SCALE_FLOOR)
        # forecast + scale * offsets as one MatMul: [forecast, scale] @ [[ones], [offsets]]
        # (a broadcast Add over [B, H, Q] took 0.5 ms at batch 1,024)
        flat = torch.matmul(torch.cat([forecast, scale], dim=1), self.quantile_map)
        if self.nonnegative:
            flat = torch.relu(flat)
        return forecast, flat.reshape(-1, self.horizon_steps, self.n_levels)  # static [H, Q]: the contract

    def others(self, normed: torch.Tensor) -> torch.Tensor:
        """The other features' normalised windows, flattened step by step ``[B, (F - 1) * T]``
        (the order the models read them in)."""
        return normed[:, 1:].transpose(1, 2).flatten(1)


def seasonal_naive(target: torch.Tensor, seasons: tuple[int, ...], horizon: int) -> torch.Tensor:
    """``[B, K * H]``: the seasonal-naive forecast of each period, ``y[t + h - s * (h // s + 1)]``,
    cut from the newest steps of ``target [B, T]`` by Slice (and Concat for a period shorter than
    the horizon). ORT's Gather of the same 48 values took 190 us at batch 1,024, a one-hot MatMul
    130 us, the slices 35 us."""
    parts = []
    for period in seasons:
        if period >= horizon:
            parts.append(target[:, -period:] if period == horizon else target[:, -period : horizon - period])
        else:
            repeats = -(-horizon // period)
            parts.append(torch.cat([target[:, -period:]] * repeats, dim=1)[:, :horizon])
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _periods(positions: torch.Tensor, horizon: int, end: int) -> tuple[int, ...]:
    """The periods of a model's anchor positions (each block of ``horizon`` starts at ``end - s``)."""
    return tuple(int(end - positions[k]) for k in range(0, len(positions), horizon))


def _mix_matrix(mix: torch.Tensor) -> torch.Tensor:
    """``[K * H, H]``: ``anchors_flat @ M`` is ``(anchors.reshape(K, H) * mix).sum(0)``."""
    periods, horizon = mix.shape
    matrix = torch.zeros(periods * horizon, horizon, dtype=torch.float64)
    for k in range(periods):
        matrix[k * horizon : (k + 1) * horizon] = torch.diag(mix[k].detach().double())
    return matrix


class WindowForm(_Form):
    """N-HiTS (any window family with a non-linear core): the newest ``lookback`` steps, anchors
    by one MatMul, the core's blocks unchanged."""

    def __init__(self, model: WindowForecaster):
        super().__init__(model, model.lookback)
        self.core = model.core
        self.horizon = model.mix.shape[1]
        self.periods = _periods(model.anchor_index, self.horizon, model.lookback)
        self.register_buffer("mix", _mix_matrix(model.mix).float())

    def forward(self, history: torch.Tensor):
        rows = self.rows(history)
        centered, level, spread = self.normalise(rows)
        normed = self.scaled(centered, spread)
        target = self.target(normed)
        anchors = seasonal_naive(target, self.periods, self.horizon)  # [B, K * H]
        extra = anchors if self.n_features == 1 else torch.cat([self.others(normed), anchors], dim=1)
        out = torch.matmul(anchors, self.mix) + self.core.stack(target, extra)
        return self.outputs(self.target(rows), out * self.target(spread) + self.target(level))


class FoldedLinearForm(_Form):
    """DLinear folded: ``forecast = (normed.flatten(1) @ A + b) * spread + level``."""

    def __init__(self, model: WindowForecaster):
        super().__init__(model, model.lookback)
        weight, bias = fold_linear(model)  # rows in the model's order: step by step, features within
        lookback, features = model.lookback, self.n_features
        weight = weight.reshape(lookback, features, -1).transpose(0, 1).reshape(lookback * features, -1)
        self.register_buffer("weight", weight.float())  # rows feature by feature, as normed.flatten(1)
        self.register_buffer("bias", bias.float())

    def forward(self, history: torch.Tensor):
        rows = self.rows(history)
        centered, level, spread = self.normalise(rows)
        spread0, level0 = self.target(spread), self.target(level)
        if self.n_features == 1 and not self.norm_steps:  # (centered / s) @ A * s == centered @ A: no division
            forecast = torch.matmul(self.target(centered), self.weight) + self.bias * spread0 + level0
        else:
            forecast = (torch.matmul(self.scaled(centered, spread).flatten(1), self.weight) + self.bias) * spread0 + level0
        return self.outputs(self.target(rows), forecast)


def fold_linear(model: WindowForecaster) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [lookback * F, horizon], b [horizon])`` in float64 with ``forecast_normed(n) ==
    n.flatten(1) @ A + b`` for a model whose ``forecast_normed`` is affine; ValueError if it is not."""
    double = copy.deepcopy(model).double().eval()
    lookback, features = model.lookback, model.feature_mean.shape[-1]
    size = lookback * features
    with torch.no_grad():
        bias = double.forecast_normed(torch.zeros(1, lookback, features, dtype=torch.float64))[0]
        basis = torch.eye(size, dtype=torch.float64).reshape(size, lookback, features)
        weight = double.forecast_normed(basis) - bias
        probe = torch.randn(8, lookback, features, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        expected = double.forecast_normed(probe)
    folded = probe.flatten(1) @ weight + bias
    error = float((folded - expected).abs().max() / expected.abs().max().clamp_min(1.0))
    if not error <= FOLD_TOLERANCE:
        raise ValueError(f"{type(model.core).__name__} is not affine in its window: folded error {error:.3g}")
    return weight, bias


class SequenceForm(_Form):
    """LSTM and Transformer: the whole history; the anchors, their mix and the head's anchor
    columns in one MatMul of the newest steps."""

    def __init__(self, model: Forecaster):
        super().__init__(model, None)
        core = model.core
        self.transformer = isinstance(core, TransformerCore)
        # a copy, so that tracing the explicit attention leaves the eager model as it is
        self.core = copy.deepcopy(core)
        for layer in self.core.modules():
            if isinstance(layer, EncoderLayer):
                layer.explicit_attention = True
        horizon = core.head.out_features
        self.horizon = horizon
        self.periods = _periods(model.anchor_offset, horizon, 0)
        head_weight = core.head.weight.detach().double()
        n_anchor = head_weight.shape[1] - _feature_width(core)
        if model.reads_anchors:  # anchors @ (mix + the head's anchor columns)
            anchor_map = _mix_matrix(model.mix)
            if n_anchor:
                anchor_map = anchor_map + head_weight[:, -n_anchor:].T
        else:  # the single primary anchor, added as it is
            anchor_map = torch.eye(horizon, dtype=torch.float64)
        self.register_buffer("anchor_map", anchor_map.float())  # [K * H, H]
        self.head = nn.Linear(head_weight.shape[1] - n_anchor, horizon)
        with torch.no_grad():
            self.head.weight.copy_(core.head.weight[:, : self.head.in_features])
            self.head.bias.copy_(core.head.bias)
        if self.transformer:
            # sin and cos of the same angle as one Sin: sin(position * f + phase), phase 0 | pi/2
            inv_freq = core.inv_freq.detach()
            self.register_buffer("frequencies", torch.cat([inv_freq, inv_freq]))
            self.register_buffer("phases", torch.cat([torch.zeros_like(inv_freq),
                                                      torch.full_like(inv_freq, math.pi / 2)]))

    def forward(self, history: torch.Tensor):
        rows = self.rows(history)
        centered, level, spread = self.normalise(rows)
        normed = self.scaled(centered, spread)
        target = self.target(normed)
        # the core reads [B, T, F]; a single feature is only reshaped
        steps = target.unsqueeze(2) if self.n_features == 1 else normed.transpose(1, 2)
        anchors = torch.matmul(seasonal_naive(target, self.periods, self.horizon), self.anchor_map)
        if self.transformer:
            tokens = history.shape[1] // self.core.patch
            position = torch.arange(tokens - 1, -1, -1, dtype=torch.float32, device=history.device).unsqueeze(1)
            features = self.core.features(steps, torch.sin(position * self.frequencies + self.phases))
        else:
            features = self.core.features(steps)
        out = anchors + self.head(features)
        return self.outputs(self.target(rows), out * self.target(spread) + self.target(level))


class EnsembleForm(_Form):
    """The ensemble: each member's own form (forecast only), their combination (a weighted sum,
    or the median as fixed weights over the sorted forecasts, one TopK), then the ensemble's
    quantiles and clip at 0 as any form's."""

    def __init__(self, model: EnsembleForecaster):
        nn.Module.__init__(self)
        self.window = None
        self.forms = nn.ModuleList(graph_form(member) for member in model.core)
        self.median = bool(model.median)
        self.register_buffer("combination", model.weights.detach().float().clone())
        self.init_outputs(model, None)
        if hasattr(model, "min_history"):
            self.min_history = model.min_history

    def forward(self, history: torch.Tensor):
        forecasts = torch.stack([form(history) for form in self.forms], dim=-1)  # [B, H, M]
        if self.median:
            forecasts = torch.topk(forecasts, len(self.forms), dim=-1, largest=False, sorted=True).values
        return self.outputs(history[:, :, 0], (forecasts * self.combination).sum(dim=-1))


def _feature_width(core: nn.Module) -> int:
    return 2 * core.d_model if isinstance(core, TransformerCore) else core.lstm.hidden_size
