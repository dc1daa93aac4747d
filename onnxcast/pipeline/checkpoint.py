"""A trained model in a run folder: ``model.pt`` (the state dict, loadable with
``weights_only=True``) and ``model.json`` (its ModelSpec and how it was made). torch is imported
when a model is saved or loaded, never at module import."""

from __future__ import annotations

from onnxcast import __version__
from onnxcast.base.files import read_json, replacing, write_json
from onnxcast.pipeline.config import PipelineConfig


def save_model(cfg: PipelineConfig, family: str, model, spec, extra: dict) -> None:
    """Write ``model.pt`` (state dict, loadable with weights_only=True) and ``model.json``."""
    import torch

    directory = cfg.layout.family(family)
    directory.mkdir(parents=True, exist_ok=True)
    with replacing(cfg.layout.model_pt(family)) as tmp:
        torch.save(model.state_dict(), tmp)
    write_json(cfg.layout.model_json(family), {"spec": spec.to_dict(), "onnxcast_version": __version__, **extra})


def load_model(cfg: PipelineConfig, family: str):
    """The trained model of ``family`` from the run directory, loaded with weights_only=True."""
    import torch

    from onnxcast.pipeline.models import ModelSpec, build_model

    spec = ModelSpec(**read_json(cfg.layout.model_json(family))["spec"])
    model = build_model(spec)
    model.load_state_dict(torch.load(cfg.layout.model_pt(family), weights_only=True))
    return model.eval(), spec
