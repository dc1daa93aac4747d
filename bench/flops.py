"""Analytical FLOP counts of the forecasters (2 FLOPs per multiply-accumulate).

Counts the matrix products only (Linear, LSTM gates, attention scores and context), which
is what a GEMM peak is comparable with; element-wise work (activations, softmax,
normalisation, the Forecaster's scaling) is left out and so counts against the achieved rate.
"""

from __future__ import annotations


def lstm_flops(n_features: int, hidden: int, layers: int, horizon: int, time: int) -> int:
    """Per forecast: each step of each layer multiplies [input, h] by the 4 gates' weights."""
    total = 0
    for layer in range(layers):
        inputs = n_features if layer == 0 else hidden
        total += time * 2 * 4 * hidden * (inputs + hidden)
    return total + 2 * hidden * horizon


def transformer_flops(n_features: int, d_model: int, layers: int, horizon: int, time: int) -> int:
    """Per forecast: embedding, per layer q/k/v/out projections, scores and context (all heads
    together), a 2*d_model feed-forward; the head reads [last token, mean] (2*d_model)."""
    per_layer = (4 * 2 * time * d_model * d_model            # q, k, v, out projections
                 + 2 * 2 * time * time * d_model             # scores and context
                 + 2 * 2 * time * d_model * 2 * d_model)     # ff1 and ff2
    return 2 * time * n_features * d_model + layers * per_layer + 2 * 2 * d_model * horizon


def model_flops(spec, time: int) -> int:
    """FLOPs of one forecast of a model built from ``spec`` (onnxcast.pipeline.models.ModelSpec)."""
    if spec.family == "lstm":
        return lstm_flops(spec.n_features, spec.hidden_size, spec.num_layers, spec.horizon, time)
    if spec.family == "transformer":
        return transformer_flops(spec.n_features, spec.d_model, spec.num_layers, spec.horizon, time)
    if spec.family in ("nhits", "dlinear"):  # window families: only Linear layers and constant matmuls
        return linear_flops(spec)
    raise ValueError(f"unknown family {spec.family!r}")


def linear_flops(spec) -> int:
    """Per forecast: 2 * in * out of every Linear layer of the built model, plus the N-HiTS
    interpolation matmuls ([knots] x [knots, horizon]); they read the last ``lookback`` steps
    whatever the history length."""
    import torch

    from onnxcast.pipeline.models import build_model

    model = build_model(spec)
    total = sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    for name, buffer in model.named_buffers():
        if name.endswith("interpolate"):
            total += 2 * buffer.shape[0] * buffer.shape[1]
    return total
