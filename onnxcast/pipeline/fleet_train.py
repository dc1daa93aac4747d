"""Global models: one model per family trained on windows drawn from every series of a fleet.

Windows are drawn lazily (:class:`WindowSampler`: a series, then an origin in its training
segment, the history gathered from the flat values array and edge-padded before the series
start), never all materialised. The model is built with the identity scaler (the per-window
normalisation inside the graph makes it scale-free; a pooled scaler flattens the windows of
small series, docs/design/fleet.md finding 1) and the loss weighs each window by
``1 / mase_scale`` of its series, so big series do not own it.

Design: docs/design/fleet.md section 3.
"""

from __future__ import annotations

from onnxcast.pipeline.config import PipelineConfig


def train_global(cfg: PipelineConfig, family: str) -> dict:
    """Train ``family`` on the fleet in ``data/fleet/``; save it as train_family does
    (model.pt, model.json with a spec whose ``global_model`` is true); return
    ``{"family", "epochs", "best_validation_loss"}``."""
    raise NotImplementedError("fleet training: train_global")
