"""Forecasters: ``history [batch, time, n_features]`` (raw units) -> ``forecast [batch, horizon]``
(raw units). LSTM and Transformer encoder (:class:`Forecaster`), and the window families
N-HiTS and DLinear (:class:`WindowForecaster`).

Scaling lives inside the module (and so inside the ONNX graph): a global standard scaler
fitted on the training segment, then per-window normalisation (RevIN without affine
parameters), which keeps the models honest on trending series whose holdout level was
never seen in training. The LSTM and Transformer cores accept any history length; the
window families read the newest ``lookback`` steps of any history at least that long (the
ONNX contract, docs/architecture.md).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from onnxcast.pipeline.config import BASE_MAX_HORIZON
from onnxcast.pipeline.intervals import SCALE_EPS_RELATIVE, SCALE_FLOOR, interval_lag

EPS = 1e-5
# Global models (identity scaler, raw units): the per-window spread floor is relative to the
# window's level, sqrt(var + EPS_RELATIVE * level**2 + EPS_FLOOR), so a model's forecast of
# c * x is c times its forecast of x. The absolute EPS squashed the windows of small series
# (an M1 monthly series of level 0.3, variance 4e-4: its forecast moved by 1.3 % of its spread
# when scaled by 1e6). 1e-10 is far below any real window's var/level**2 and far above float32
# rounding noise (1e-14), so constant windows still normalise to zero.
EPS_RELATIVE = 1e-10
EPS_FLOOR = 1e-30
# ModelSpec.normalisation "recent" (issue 32): the window is centred and scaled on its newest
# steps, and the normalised window clipped at +-NORM_CLIP (docs/fleet.md, "Blow-ups").
NORMALISATIONS = ("window", "recent")
NORM_CLIP = 10.0


def recent_steps(season: int, lookback: int) -> int:
    """The newest steps a "recent" normalisation reads: half the lookback, at least one season,
    at most the lookback (18 of 36 on monthly panels)."""
    return max(1, min(lookback, max(season, lookback // 2)))


@contextmanager
def torch_threads(threads: int):
    """Run the block with ``threads`` torch threads (training and the eager reference)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


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
    # every seasonal period the model anchors on, the primary ``season`` first; empty (model.json
    # files written before it existed) means ``(season,)``, and for the LSTM and the Transformer
    # the first release's design: one anchor, added to a correction that does not read it
    seasons: tuple[int, ...] = ()
    # fleet mode: one model trained on windows of many series (the identity scaler, per-window
    # normalisation only); model.json files written before fleet mode load with the defaults
    global_model: bool = False
    n_series: int = 0
    # the levels of the ``quantiles`` output (onnxcast.pipeline.intervals); empty: a model from
    # before forecast distributions, calibrated when a run exports it
    quantile_levels: tuple[float, ...] = ()
    # steps per token of the LSTM and the Transformer (PatchTST, SegRNN); 1, one token a step, is
    # the first releases' model
    patch: int = 1
    # the target was never negative in training (every series' training part, :func:`never_negative`):
    # the forecast and its quantiles are clipped at 0 in the module and the graph (a Relu after
    # each output). model.json files written before it existed load as False, not clipped
    nonnegative: bool = False
    # how the window is normalised: "window", its mean and standard deviation (the releases before
    # issue 32; model.json files without the field); "recent", the mean and standard deviation of
    # its newest recent_steps(season, lookback) steps, the normalised window clipped at
    # +-NORM_CLIP (global models since issue 32: a level shift in the window no longer sets the
    # forecast's scale)
    normalisation: str = "window"
    # family "ensemble" (onnxcast.pipeline.ensemble): the member models' specs (each keeps its own
    # normalisation and nonnegative handling) and the combination's weights, one a member, in
    # their order; no weights: the median of the members' forecasts. Empty for every other family
    members: tuple[dict, ...] = ()
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "seasons", tuple(int(s) for s in self.seasons))
        object.__setattr__(self, "quantile_levels", tuple(float(q) for q in self.quantile_levels))
        object.__setattr__(self, "members", tuple(dict(m) for m in self.members))
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))

    @property
    def anchor_seasons(self) -> tuple[int, ...]:
        """The periods whose seasonal-naive forecasts the model reads: ``season`` first, then
        the other ``seasons`` that fit in the lookback."""
        rest = [s for s in self.seasons if s != self.season and s <= self.lookback]
        return (self.season, *dict.fromkeys(rest))

    def to_dict(self) -> dict:
        return asdict(self)


def never_negative(target: np.ndarray, offsets: np.ndarray | None = None,
                   train_end: np.ndarray | None = None) -> bool:
    """Whether the training values of a target are all ``>= 0`` (``ModelSpec.nonnegative``: the
    model then never forecasts a negative value). ``target``: one series' training rows; or, with
    ``offsets`` ``[n + 1]`` and ``train_end`` ``[n]``, a fleet's series back to back, of which
    the first ``train_end[i]`` rows of series ``i`` are its training part. Missing values are
    ignored; no value at all is no evidence (False)."""
    values = np.asarray(target, dtype=np.float64)
    if offsets is not None:
        lengths = np.diff(offsets)
        position = np.arange(len(values)) - np.repeat(offsets[:-1], lengths)
        values = values[position < np.repeat(np.asarray(train_end), lengths)]
    values = values[~np.isnan(values)]
    return bool(values.size) and bool(values.min() >= 0.0)


def build_model(spec: ModelSpec, mean: np.ndarray | None = None, std: np.ndarray | None = None) -> QuantileOutput:
    """A fresh model for ``spec``; ``mean``/``std`` are the training-segment column statistics."""
    # LSTM / Transformer with ``seasons``: every anchor mixed and read by the correction head
    anchors = spec.anchor_seasons if spec.seasons else ()
    n_anchor_inputs = len(anchors) * spec.horizon
    if spec.family == ENSEMBLE:
        return _with_spec(EnsembleForecaster([build_model(ModelSpec(**m)) for m in spec.members], spec.weights),
                          spec)
    if spec.family not in ("lstm", "transformer", *WINDOW_FAMILIES):
        raise ValueError(f"unknown model family {spec.family!r}; expected one of 'lstm', 'transformer', "
                         + ", ".join(repr(f) for f in WINDOW_FAMILIES))
    model: QuantileOutput
    if spec.family in WINDOW_FAMILIES:
        seasons = spec.anchor_seasons
        if spec.family == "nhits":
            window_core: nn.Module = NHiTSCore(spec.n_features, spec.lookback, spec.horizon, len(seasons),
                                               8 * spec.hidden_size, NHITS_DROPOUT)
        elif spec.family == "base":  # the pretrained net: scale-free (identity scaler), docs/pretrained.md
            window_core = BaseCore(spec.n_features, spec.lookback, spec.horizon, spec.season)
            mean, std = np.zeros(spec.n_features), np.ones(spec.n_features)
        else:
            window_core = DLinearCore(spec.n_features, spec.lookback, spec.horizon, len(seasons))
        model = WindowForecaster(window_core, spec.n_features, spec.lookback, spec.horizon, seasons, mean, std,
                                 spec.global_model or spec.family == "base")
    else:
        if spec.family == "lstm":
            core: nn.Module = LSTMCore(spec.n_features, spec.hidden_size, spec.num_layers, spec.horizon,
                                       n_anchor_inputs, patch=spec.patch)
        else:
            core = TransformerCore(spec.n_features, spec.d_model, spec.n_heads, spec.num_layers, spec.horizon,
                                   n_anchor_inputs, patch=spec.patch)
        model = Forecaster(core, spec.n_features, spec.season, mean, std, anchors, spec.global_model)
    if spec.normalisation not in NORMALISATIONS:
        raise ValueError(f"unknown normalisation {spec.normalisation!r}; expected one of {NORMALISATIONS}")
    model.norm_steps = recent_steps(spec.season, spec.lookback) if spec.normalisation == "recent" else 0
    return _with_spec(model, spec)


def _with_spec(model: QuantileOutput, spec: ModelSpec) -> QuantileOutput:
    """``model`` with what every forecaster takes from its spec: the interval scale's lag and
    window, the clip at 0 of a never-negative target, the quantiles' buffer."""
    model.interval_lag = interval_lag(spec.season, spec.lookback)
    model.interval_lookback = spec.lookback
    model.nonnegative = bool(spec.nonnegative)
    if spec.quantile_levels:
        model.add_quantiles(spec.horizon, len(spec.quantile_levels))
    return model


# The interval scale of a window (QuantileOutput.interval_scale; its numpy twin, for the
# baselines, is onnxcast.pipeline.intervals.window_scale, which owns the constants).


class QuantileOutput(nn.Module):
    """The forecast distribution of a forecaster: ``quantiles [batch, horizon, Q]`` =
    ``forecast + scale(window) * offsets[horizon, Q]``.

    ``scale`` is the window's mean absolute change of the target over ``interval_lag`` steps,
    the model's season (:func:`interval_lag`; per window, so one calibration serves every series
    of a fleet at its own level and volatility): the in-window MASE scale. The one-step change
    first used counts a regular seasonal swing, which the forecast follows, as uncertainty: on M3
    quarterly (756 series, 1 minute of training per family) it gave the best calibrated
    intervals (80%: 81-83%, 95%: 95-96%) but a mean MSIS (95%) of 14.0-14.4 against AutoETS's
    11.3; the seasonal change gave 80.4-80.6% / 94.4-94.7% and 10.2-10.5 with the same forecasts
    (bench/fleet.py accuracy, 2026-12-01). ``offsets``
    are split-conformal quantiles of the scaled validation errors per horizon step, set by
    onnxcast.pipeline.intervals.calibrate and sorted ascending along Q. ``scale >= 0`` and
    sorted offsets make the quantiles non-crossing by construction: float rounding is
    monotone, so ``f + s * a <= f + s * b`` whenever ``a <= b``, in any precision.
    """

    quantile_offsets: torch.Tensor
    interval_lag: int = 1  # set by build_model from the spec (interval_lag)
    interval_lookback: int = 0  # the newest steps the scale reads (the spec's lookback; 0: all)
    nonnegative: bool = False  # set by build_model from the spec: forecast and quantiles clipped at 0

    def add_quantiles(self, horizon: int, n_levels: int) -> None:
        self.register_buffer("quantile_offsets", torch.zeros(horizon, n_levels))

    @property
    def has_quantiles(self) -> bool:
        return "quantile_offsets" in self._buffers

    def interval_window(self, history: torch.Tensor) -> torch.Tensor:
        """The target steps the interval scale reads ``[batch, steps]``: the newest
        ``interval_lookback``, the window length it was calibrated on (a longer history, which
        the LSTM and the Transformer take, gets the same scale)."""
        if self.interval_lookback:
            return history[:, -self.interval_lookback:, 0]
        return history[:, :, 0]

    def interval_scale(self, history: torch.Tensor) -> torch.Tensor:
        """``[batch]``: mean ``|y[t] - y[t - interval_lag]|`` over the window, plus
        SCALE_EPS_RELATIVE x its mean ``|y|`` and a float32-safe floor."""
        window = self.interval_window(history)
        lag = self.interval_lag
        change = (window[:, lag:] - window[:, :-lag]).abs().mean(dim=1)
        return change + SCALE_EPS_RELATIVE * window.abs().mean(dim=1) + SCALE_FLOOR

    def forecast_and_quantiles(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        forecast = self(history)  # clipped at 0 already when ``nonnegative``
        scale = self.interval_scale(history)
        quantiles = forecast.unsqueeze(-1) + scale[:, None, None] * self.quantile_offsets
        # clipping is monotone: quantiles sorted along Q stay sorted
        return forecast, torch.relu(quantiles) if self.nonnegative else quantiles


class WithQuantiles(nn.Module):
    """What the exporter traces: ``history -> (forecast, quantiles)``."""

    def __init__(self, model: QuantileOutput):
        super().__init__()
        self.model = model
        self.core = model.core
        if hasattr(model, "min_history"):
            self.min_history = model.min_history

    def forward(self, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.forecast_and_quantiles(history)


class NormalisedForecaster(QuantileOutput):
    """The scaling both kinds of forecaster share: the global scaler folded in, then per-window
    normalisation (RevIN without affine parameters), and the way back to raw units. The buffers
    ``feature_mean`` / ``feature_std`` ``[1, 1, F]`` and ``relative_eps`` are set by subclasses."""

    feature_mean: torch.Tensor
    feature_std: torch.Tensor
    relative_eps: bool = False
    # "recent" normalisation: the newest steps level and spread are measured on (0: the whole window)
    norm_steps: int = 0

    def normalise(self, window: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(normed, level, spread)`` of a raw ``window [batch, time, F]``: level and spread are
        ``[batch, 1, F]`` in globally standardised units, of the whole window or (``norm_steps``)
        of its newest steps, the normalised window then clipped at +-NORM_CLIP."""
        scaled = (window - self.feature_mean) / self.feature_std
        basis = scaled[:, -self.norm_steps:] if self.norm_steps else scaled
        level = basis.mean(dim=1, keepdim=True)
        spread = window_spread(basis, level, self.relative_eps)
        normed = (scaled - level) / spread
        return (normed.clamp(-NORM_CLIP, NORM_CLIP) if self.norm_steps else normed), level, spread

    def unscale(self, out: torch.Tensor, level: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
        """A forecast ``[batch, horizon]`` in per-window units of the target, back in raw units
        (clipped at 0 for a ``nonnegative`` target)."""
        out = out * spread[:, :, 0] + level[:, :, 0]
        out = out * self.feature_std[:, :, 0] + self.feature_mean[:, :, 0]
        return torch.relu(out) if self.nonnegative else out

    def scaled_target(self, target: torch.Tensor) -> torch.Tensor:
        """Target in globally standardised units (the unit of the training loss)."""
        return (target - self.feature_mean[:, 0, :1]) / self.feature_std[:, 0, :1]


class Forecaster(NormalisedForecaster):
    """Wraps a core with the folded scaler, per-window normalisation and seasonal anchors.

    The core predicts a correction to the seasonal-naive forecast read from the history
    (``y[t + h - season * (h // season + 1)]``), so an untrained model starts at the
    baseline and training only has to learn what the baseline misses. This needs
    ``time >= season``.

    With ``seasons`` (every period the frequency implies that fits in the lookback, the
    primary first), the forecast is a learned per-step mix of those seasonal-naive forecasts
    plus the core's correction, and the core's head reads the anchors too: it can weigh last
    week against yesterday, which an LSTM cannot do from its final state when last week is
    the start of its window (half-hourly demand, lookback = one week: the training loss of the
    single-anchor LSTM stayed at 0.0143). The mix starts at the primary period alone and the
    head at zero, so the untrained model is still exactly the primary seasonal naive.
    """

    def __init__(self, core: nn.Module, n_features: int, season: int, mean: np.ndarray | None, std: np.ndarray | None,
                 seasons: tuple[int, ...] = (), relative_eps: bool = False):
        super().__init__()
        self.core = core
        self.relative_eps = relative_eps
        horizon = core.head.out_features
        steps = torch.arange(horizon)
        self.reads_anchors = bool(seasons)
        periods = seasons or (season,)
        self.register_buffer("anchor_offset", torch.cat([steps - s * (steps // s + 1) for s in periods]))
        if self.reads_anchors:
            mix = torch.zeros(len(periods), horizon)
            mix[0] = 1.0
            self.mix = nn.Parameter(mix)
        mean_t = torch.zeros(n_features) if mean is None else torch.as_tensor(mean, dtype=torch.float32)
        std_t = torch.ones(n_features) if std is None else torch.as_tensor(std, dtype=torch.float32)
        self.register_buffer("feature_mean", mean_t.reshape(1, 1, n_features).clone())
        self.register_buffer("feature_std", std_t.clamp_min(EPS).reshape(1, 1, n_features).clone())

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        normed, level, spread = self.normalise(history)
        return self.unscale(self.forecast_normed(normed), level, spread)

    def forecast_normed(self, normed: torch.Tensor) -> torch.Tensor:
        """The forecast ``[batch, horizon]`` in per-window units of the target."""
        anchor = normed[:, :, 0].index_select(1, self.anchor_offset + normed.shape[1])
        if self.reads_anchors:
            mixed = (anchor.reshape(-1, self.mix.shape[0], self.mix.shape[1]) * self.mix).sum(dim=1)
            return mixed + self.core(normed, anchor)
        return anchor + self.core(normed)


def window_spread(scaled: torch.Tensor, level: torch.Tensor, relative_eps: bool) -> torch.Tensor:
    """The per-window spread ``[batch, 1, F]``: absolute EPS for single-series models (their
    graphs unchanged), EPS relative to the level for global models (scale-equivariant)."""
    var = scaled.var(dim=1, keepdim=True, unbiased=False)
    if relative_eps:
        return torch.sqrt(var + EPS_RELATIVE * level * level + EPS_FLOOR)
    return torch.sqrt(var + EPS)


def zero_head(layer: nn.Linear) -> nn.Linear:
    """A correction head that starts at zero: the untrained model is exactly its seasonal-naive
    anchor, and training (epoch 0 competing) only moves it where validation improves."""
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


class LSTMCore(nn.Module):
    """An LSTM over patches of ``patch`` steps (segment-wise iterations, as SegRNN, Lin et al.
    2023) whose last final hidden state (and the anchors, when given) feeds a zero head.

    A step of the recurrence reads ``patch`` consecutive steps of every feature, cut from the
    newest step back like the Transformer's tokens (:func:`patches`): ``time / patch`` sequential
    steps instead of ``time``, which bound both training and inference (one step a time step,
    ``patch`` 1, is the first releases' model)."""

    def __init__(self, n_features: int, hidden: int, layers: int, horizon: int, n_anchor_inputs: int = 0,
                 patch: int = 1):
        super().__init__()
        self.patch = patch
        self.lstm = nn.LSTM(n_features * patch, hidden, num_layers=layers, batch_first=True)
        self.head = zero_head(nn.Linear(hidden + n_anchor_inputs, horizon))

    def forward(self, x: torch.Tensor, anchors: torch.Tensor | None = None) -> torch.Tensor:
        # The last layer's final hidden state (the same numbers as ``out[:, -1]``): read from
        # the LSTM op's Y_h output, its per-step output Y becomes unused, so ONNX Runtime does
        # not write and transpose [time, batch, hidden] of it (see onnxcast.pipeline.optimize).
        features = self.features(x)
        return self.head(features if anchors is None else torch.cat([features, anchors], dim=1))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """What the head reads besides the anchors: the last layer's final hidden state."""
        _, (hidden, _) = self.lstm(patches(x, self.patch))
        return hidden[-1]


class TransformerCore(nn.Module):
    """Encoder-only Transformer over patches of ``patch`` steps (PatchTST, Nie et al. 2023), with
    sinusoidal positions counted back from the newest patch.

    A token is ``patch`` consecutive steps of every feature, cut from the newest step back (the
    ``time % patch`` oldest steps of a longer history are not read), so attention costs
    ``(time / patch)**2``. One token a step (``patch`` 1, the first releases' model) spent a
    training step on the example data (lookback 168) mostly in the [batch, heads, 168, 168]
    scores: 7 steps a patch (24 tokens) trained 8.6x as many windows a second and forecast a
    batch of 64 in 6.2 instead of 69 ms in eager PyTorch (docs/performance.md).

    Attention is written out (not nn.MultiheadAttention) so the export stays dynamic in
    batch and time and has the MatMul-Softmax-MatMul shape that ORT's fusions recognise.
    """

    def __init__(self, n_features: int, d_model: int, n_heads: int, layers: int, horizon: int,
                 n_anchor_inputs: int = 0, patch: int = 1):
        super().__init__()
        self.d_model = d_model
        self.patch = patch
        self.embed = nn.Linear(n_features * patch, d_model)
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = zero_head(nn.Linear(2 * d_model + n_anchor_inputs, horizon))
        inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, x: torch.Tensor, anchors: torch.Tensor | None = None) -> torch.Tensor:
        features = self.features(x)
        return self.head(features if anchors is None else torch.cat([features, anchors], dim=-1))

    def features(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """What the head reads besides the anchors: the newest step's state and the mean state,
        ``[batch, 2 * d_model]``. ``positions`` ``[time, d_model]``: the encoding, when computed
        another way (the export form's)."""
        tokens = patches(x, self.patch)
        h = self.embed(tokens) + (self.positions(tokens.shape[1]) if positions is None else positions)
        for layer in self.layers:
            h = layer(h)
        h = self.norm(h)
        return torch.cat([h[:, -1], h.mean(dim=1)], dim=-1)

    def positions(self, time: int) -> torch.Tensor:
        """Sinusoidal encodings ``[time, d_model]`` of ``time`` tokens; position 0 is the newest,
        so a longer history only adds older positions."""
        position = torch.arange(time - 1, -1, -1, dtype=torch.float32, device=self.inv_freq.device).unsqueeze(1)
        angle = position * self.inv_freq
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)


def patches(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``[batch, time // patch, patch * F]``: the newest ``time // patch`` patches of ``x [batch,
    time, F]``, oldest first (the ``time % patch`` oldest steps are not read)."""
    if patch == 1:
        return x
    batch, time, features = x.shape
    return x[:, time % patch :].reshape(batch, time // patch, patch * features)


class EncoderLayer(nn.Module):
    """Post-norm encoder layer (BERT layout): attention, add & norm, feed-forward, add & norm.

    Attention runs in PyTorch's fused kernel (``scaled_dot_product_attention``, flash attention
    on CPU) in training and eager inference: the explicit products materialise the
    ``[batch, heads, time, time]`` scores, their division and softmax, and their gradients
    (one training step of the example model: 29% in the batched products, 15% dividing the
    scores, 15% in softmax and its backward). The exporter traces the explicit products
    (``explicit_attention``, set by onnxcast.pipeline.graph_forms), the pattern ONNX Runtime's
    attention fusion (onnxcast.pipeline.optimize.fuse_attention) matches; the parity gate
    compares the two forms on every run.
    """

    explicit_attention = False

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
        if self.explicit_attention:
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            context = torch.matmul(torch.softmax(scores, dim=-1), v)
        else:
            context = nn.functional.scaled_dot_product_attention(q, k, v)
        context = context.transpose(1, 2).reshape(batch, time, d_model)
        x = self.norm1(x + self.out(context))
        return self.norm2(x + self.ff2(torch.nn.functional.gelu(self.ff1(x))))

    def _heads(self, t: torch.Tensor, batch: int, time: int) -> torch.Tensor:
        return t.reshape(batch, time, self.n_heads, self.head_dim).transpose(1, 2)


# --- the ensemble: one graph of several trained forecasters --------------------------------

ENSEMBLE = "ensemble"


class EnsembleForecaster(QuantileOutput):
    """The combination of trained forecasters ``members`` (the ``core``, so the exporter and
    ``WithQuantiles`` find it): ``forecast = sum_m weights[m] * forecast_m`` or, with no
    ``weights``, the median of the members' forecasts (the mean of the middle two for an even
    count). Each member keeps its own scaling, normalisation and clip at 0; its own quantiles are
    not used: the ensemble's are calibrated on its own validation errors
    (onnxcast.pipeline.intervals.calibrate, as any family's). The weights are fitted by
    onnxcast.pipeline.ensemble."""

    def __init__(self, members: list[QuantileOutput], weights: tuple[float, ...] = ()):
        super().__init__()
        if len(members) < (1 if weights else 2):  # a median of one is no combination
            raise ValueError(f"an ensemble's median needs at least two members, got {len(members)}")
        if weights and len(weights) != len(members):
            raise ValueError(f"{len(weights)} weights for {len(members)} members")
        self.core = nn.ModuleList(members)
        self.median = not weights
        self.register_buffer("weights", median_weights(len(members)) if self.median
                             else torch.tensor(weights, dtype=torch.float32))
        windows = [int(m.min_history) for m in members if hasattr(m, "min_history")]
        if windows:
            self.min_history = max(windows)  # the exporter's lower bound of the time axis

    def member_forecasts(self, history: torch.Tensor) -> torch.Tensor:
        """``[batch, horizon, members]``."""
        return torch.stack([member(history) for member in self.core], dim=-1)

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        return combine(self.member_forecasts(history), self.weights, self.median)


def median_weights(count: int) -> torch.Tensor:
    """The weights that make the median of ``count`` SORTED values: 1 on the middle one, or 0.5
    on the middle two."""
    weights = torch.zeros(count)
    weights[(count - 1) // 2] += 0.5
    weights[count // 2] += 0.5
    return weights


def combine(forecasts: torch.Tensor, weights: torch.Tensor, median: bool) -> torch.Tensor:
    """``[batch, horizon]`` from the members' ``forecasts [batch, horizon, M]``: the weighted
    sum, or (``median``) the median as ``median_weights`` over the sorted forecasts."""
    values = torch.sort(forecasts, dim=-1).values if median else forecasts
    return (values * weights).sum(dim=-1)


# --- window families: read exactly the last ``lookback`` steps ----------------------------

WINDOW_FAMILIES = ("nhits", "dlinear", "base")
# Hidden width 8 x hidden_size (512 by default) with dropout 0.5: on the example (~2,500
# training windows) validation loss was best at epoch 2 without dropout; holdout MAE over three
# seeds was 323 (width 256, dropout 0.3), 315 (256, 0.5), 306 (512, 0.5); the Transformer 325.
NHITS_DROPOUT = 0.5


class WindowForecaster(NormalisedForecaster):
    """A forecaster over the last ``lookback`` steps of any longer history, anchored on the
    seasonal-naive forecasts of every period in ``seasons``.

    Same units and scaling as :class:`Forecaster` (global scaler folded in, per-window
    normalisation, raw units out), but the window is always the newest ``lookback`` steps, so
    the forecast does not depend on older rows and a history shorter than ``lookback`` is
    outside the contract. The forecast is a learned per-step mix of the seasonal-naive
    forecasts (one per period: daily and weekly for hourly data) plus the core's correction;
    the mix starts at the primary period alone, so an untrained model with a zero correction
    is the seasonal-naive baseline.
    """

    def __init__(self, core: nn.Module, n_features: int, lookback: int, horizon: int, seasons: tuple[int, ...],
                 mean: np.ndarray | None, std: np.ndarray | None, relative_eps: bool = False):
        super().__init__()
        if max(seasons) > lookback:
            raise ValueError(f"seasons {seasons} must fit in the lookback {lookback}")
        self.core = core
        self.relative_eps = relative_eps
        self.lookback = lookback
        self.min_history = lookback  # the exporter's lower bound of the dynamic time axis
        steps = torch.arange(horizon)
        # index into the window of y[t + h - s * (h // s + 1)] for each period s: [K * horizon]
        self.register_buffer("anchor_index", torch.cat([lookback + steps - s * (steps // s + 1) for s in seasons]))
        mix = torch.zeros(len(seasons), horizon)
        mix[0] = 1.0
        self.mix = nn.Parameter(mix)
        mean_t = torch.zeros(n_features) if mean is None else torch.as_tensor(mean, dtype=torch.float32)
        std_t = torch.ones(n_features) if std is None else torch.as_tensor(std, dtype=torch.float32)
        self.register_buffer("feature_mean", mean_t.reshape(1, 1, n_features).clone())
        self.register_buffer("feature_std", std_t.clamp_min(EPS).reshape(1, 1, n_features).clone())

    def interval_window(self, history: torch.Tensor) -> torch.Tensor:
        return history[:, history.shape[1] - self.lookback :, 0]

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        normed, level, spread = self.normalise(history[:, history.shape[1] - self.lookback :])
        return self.unscale(self.forecast_normed(normed), level, spread)

    def forecast_normed(self, normed: torch.Tensor) -> torch.Tensor:
        """The forecast ``[batch, horizon]`` in per-window units of the target, from the
        normalised window ``[batch, lookback, F]``."""
        anchors = normed[:, :, 0].index_select(1, self.anchor_index).reshape(-1, self.mix.shape[0], self.mix.shape[1])
        return (anchors * self.mix).sum(dim=1) + self.core(normed, anchors)


def _interpolation(n_coef: int, horizon: int) -> torch.Tensor:
    """``[n_coef, horizon]``: linear interpolation of ``n_coef`` knots over ``horizon`` steps
    (a constant matrix, so the export is one MatMul)."""
    if n_coef >= horizon:
        return torch.eye(horizon)
    position = torch.linspace(0, n_coef - 1, horizon)
    low = position.floor().clamp(max=n_coef - 2).long()
    frac = position - low
    matrix = torch.zeros(n_coef, horizon)
    matrix[low, torch.arange(horizon)] = 1 - frac
    matrix[low + 1, torch.arange(horizon)] += frac
    return matrix


class NHiTSBlock(nn.Module):
    def __init__(self, lookback: int, pool: int, n_extra: int, hidden: int, n_coef: int, horizon: int,
                 dropout: float = 0.0):
        super().__init__()
        self.pool = nn.MaxPool1d(pool, stride=pool, ceil_mode=True) if pool > 1 else None
        pooled = -(-lookback // pool)
        self.mlp = nn.Sequential(nn.Linear(pooled + n_extra, hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout))
        self.backcast = nn.Linear(hidden, lookback)
        self.forecast = nn.Linear(hidden, n_coef)
        self.register_buffer("interpolate", _interpolation(n_coef, horizon))

    def forward(self, residual: torch.Tensor, extra: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pooled = residual if self.pool is None else self.pool(residual.unsqueeze(1)).squeeze(1)
        h = self.mlp(torch.cat([pooled, extra], dim=1))
        return self.backcast(h), torch.matmul(self.forecast(h), self.interpolate)


class NHiTSCore(nn.Module):
    """N-HiTS (Challu et al. 2023): a stack of MLP blocks, each reading the target window at
    its own rate (max-pooling) and forecasting at its own resolution (few knots, linearly
    interpolated), fitting what the earlier blocks left (backcast residual). Other feature
    columns (their last ``lookback`` steps) and the seasonal anchors are extra inputs."""

    def __init__(self, n_features: int, lookback: int, horizon: int, n_seasons: int, hidden: int,
                 dropout: float = 0.0):
        super().__init__()
        pools = [max(1, lookback // 24), max(1, lookback // 84), 1]
        coefs = [max(2, horizon // 12), max(2, horizon // 4), horizon]
        n_extra = (n_features - 1) * lookback + n_seasons * horizon
        self.blocks = nn.ModuleList(NHiTSBlock(lookback, p, n_extra, hidden, c, horizon, dropout) for p, c in zip(pools, coefs, strict=True))

    def forward(self, x: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        return self.stack(x[:, :, 0], torch.cat([x[:, :, 1:].flatten(1), anchors.flatten(1)], dim=1))

    def stack(self, target: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """The blocks over the target window ``[batch, lookback]`` and the extra inputs (the other
        features' windows, flattened step by step, then the anchors)."""
        residual = target
        forecast = None
        for block in self.blocks:
            backcast, step = block(residual, extra)
            residual = residual - backcast
            forecast = step if forecast is None else forecast + step
        return forecast


class DLinearCore(nn.Module):
    """DLinear (Zeng et al. 2023): the window split into a moving-average trend and the rest,
    one linear map each to the horizon; feature columns and anchors enter linearly too."""

    def __init__(self, n_features: int, lookback: int, horizon: int, n_seasons: int, kernel: int = 25):
        super().__init__()
        self.kernel = min(kernel, lookback) | 1  # odd, so the average is centred
        self.trend = nn.Linear(lookback, horizon)
        self.seasonal = nn.Linear(lookback, horizon)
        self.extra = nn.Linear((n_features - 1) * lookback + n_seasons * horizon, horizon)
        for layer in (self.trend, self.seasonal, self.extra):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        y = x[:, :, 0]
        pad = self.kernel // 2
        padded = torch.cat([y[:, :1].expand(-1, pad), y, y[:, -1:].expand(-1, pad)], dim=1)
        trend = torch.nn.functional.avg_pool1d(padded.unsqueeze(1), self.kernel, stride=1).squeeze(1)
        extra = torch.cat([x[:, :, 1:].flatten(1), anchors.flatten(1)], dim=1)
        return self.trend(trend) + self.seasonal(y - trend) + self.extra(extra)


# --- the pretrained base forecaster (family "base", docs/pretrained.md) --------------------------

BASE_CONTEXT = 96  # normalised steps the net reads (a shorter window is zero-padded on the left, masked)
BASE_HORIZON = BASE_MAX_HORIZON  # steps the net forecasts; a run's horizon takes the first ones
BASE_WIDTH = 256
BASE_BLOCKS = 4


class BaseNet(nn.Module):
    """The pretrained net: ``(context [B, C], mask [B, C], anchor [B, H]) -> forecast [B, H]``,
    all in per-window units: a residual MLP (pre-norm blocks) whose zero-initialised head
    corrects the seasonal-naive ``anchor``, so the untrained net is the seasonal naive."""

    def __init__(self, context: int = BASE_CONTEXT, horizon: int = BASE_HORIZON, width: int = BASE_WIDTH,
                 blocks: int = BASE_BLOCKS):
        super().__init__()
        self.context, self.horizon = context, horizon
        self.embed = nn.Linear(2 * context + horizon, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(),
                                                  nn.Linear(2 * width, width)) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        self.head = zero_head(nn.Linear(width, horizon))

    def forward(self, context: torch.Tensor, mask: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        h = self.embed(torch.cat([context, mask, anchor], dim=1))
        for block in self.blocks:
            h = h + block(h)
        return anchor + self.head(self.norm(h))


def base_anchor_index(lookback: int, season: int, horizon: int = BASE_HORIZON) -> torch.Tensor:
    """``[horizon]``: the index into a window of ``lookback`` steps of ``y[t + h - s * (h // s + 1)]``,
    the seasonal-naive forecast of period ``season`` (1 when it does not fit the window)."""
    s = season if 1 <= season <= lookback else 1
    steps = torch.arange(horizon)
    return lookback + steps - s * (steps // s + 1)


class BaseCore(nn.Module):
    """The window-family core of the pretrained net (:class:`BaseNet`) for a run's lookback,
    horizon and season: it reads the target's normalised window (other features are not read),
    its newest ``BASE_CONTEXT`` steps zero-padded on the left, and forecasts the first
    ``horizon`` of ``BASE_HORIZON`` steps, returned as a correction to the primary anchor the
    WindowForecaster mixes in (its mix starts at that anchor alone: the untouched model is the
    pretrained one)."""

    def __init__(self, n_features: int, lookback: int, horizon: int, season: int):
        super().__init__()
        if horizon > BASE_HORIZON:
            raise ValueError(f"the base model forecasts at most {BASE_HORIZON} steps, got horizon {horizon}")
        self.net = BaseNet()
        self.lookback, self.horizon = lookback, horizon
        self.others = (n_features - 1) * lookback  # where the anchors start in ``extra``
        keep = min(lookback, BASE_CONTEXT)
        self.pad = BASE_CONTEXT - keep
        self.register_buffer("mask", torch.cat([torch.zeros(self.pad), torch.ones(keep)]).unsqueeze(0))
        self.register_buffer("anchor_index", base_anchor_index(lookback, season))

    def forward(self, x: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        return self.stack(x[:, :, 0], torch.cat([x[:, :, 1:].flatten(1), anchors.flatten(1)], dim=1))

    def stack(self, target: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """The correction ``[batch, horizon]`` from the normalised target window ``[batch, lookback]``
        and the extra inputs (other features' windows, then the anchors, as N-HiTS reads them)."""
        context = target[:, self.lookback - (BASE_CONTEXT - self.pad):]
        if self.pad:
            context = nn.functional.pad(context, (self.pad, 0))
        mask = self.mask.expand(target.shape[0], -1)
        forecast = self.net(context, mask, target.index_select(1, self.anchor_index))
        return forecast[:, : self.horizon] - extra[:, self.others : self.others + self.horizon]
