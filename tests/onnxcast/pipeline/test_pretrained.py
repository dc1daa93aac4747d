"""The pretrained base forecaster: its corpus, its pretraining windows, the shipped weights
(onnxcast.pipeline.pretrained) and the family ``base`` in a run."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from onnxcast.base.contract import read_metadata
from onnxcast.pipeline.models import BASE_CONTEXT, ModelSpec, build_model, recent_steps
from onnxcast.pipeline.pretrained.corpus import build_corpus
from onnxcast.pipeline.pretrained.train import BatchMaker, anchor_indices, normalise, pretrain
from onnxcast.pipeline.pretrained.weights import (
    BASE_PROVENANCE_METADATA,
    WEIGHTS,
    load_weights,
    read_provenance,
    sha256,
)


def _synthetic(seed: int):
    return build_corpus(seed, n_kernelsynth=4, n_generator=4, real=False)


def test_the_corpus_is_the_same_for_a_seed_and_another_for_another_seed():
    one, again, other = _synthetic(3), _synthetic(3), _synthetic(4)
    for group in ("kernelsynth", "generator"):
        assert one.seasons[group] == again.seasons[group]
        assert all(np.array_equal(a, b) for a, b in zip(one.series[group], again.series[group], strict=True))
        assert not all(len(a) == len(b) and np.allclose(a, b)
                       for a, b in zip(one.series[group], other.series[group], strict=True))


def test_pretraining_is_repeatable_for_a_seed():
    corpus = _synthetic(5)
    first, _ = pretrain(corpus, steps=3, batch_size=8, learning_rate=1e-3, seed=1, threads=1)
    second, _ = pretrain(corpus, steps=3, batch_size=8, learning_rate=1e-3, seed=1, threads=1)
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("lookback", "season", "horizon"), [(36, 12, 18), (168, 48, 24), (16, 4, 8)])
def test_a_run_model_forecasts_what_the_pretrained_net_does_on_the_pretraining_windows(lookback, season, horizon):
    """The windows pretraining feeds the net (train.BatchMaker's normalisation, context, mask and
    anchor) are what the family's WindowForecaster feeds it in a run: the untouched run model is
    the pretrained net, in raw units."""
    torch.manual_seed(0)
    spec = ModelSpec(family="base", n_features=1, horizon=horizon, lookback=lookback, season=season,
                     seasons=(season,), normalisation="recent")
    model = build_model(spec).eval()
    with torch.no_grad():
        for parameter in model.core.net.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    rng = np.random.default_rng(0)
    raw = (rng.standard_normal((4, lookback)) * [[1.0], [50.0], [1e-3], [7.0]] + [[10.0], [5e4], [2e-3], [-3.0]])
    normed, level, spread = normalise(raw, np.full(4, recent_steps(season, lookback)))
    anchor = np.take_along_axis(normed, anchor_indices(lookback, np.full(4, season)), axis=1)
    keep = min(lookback, BASE_CONTEXT)
    context, mask = np.zeros((4, BASE_CONTEXT)), np.zeros((4, BASE_CONTEXT))
    context[:, BASE_CONTEXT - keep:], mask[:, BASE_CONTEXT - keep:] = normed[:, lookback - keep:], 1.0
    with torch.no_grad():
        tensors = (torch.from_numpy(a.astype(np.float32)) for a in (context, mask, anchor))
        pretrained = model.core.net(*tensors).numpy()[:, :horizon] * spread[:, None] + level[:, None]
        forecast = model(torch.from_numpy(raw.astype(np.float32))[:, :, None]).numpy()
    error = np.abs(forecast - pretrained) / (spread + 1e-6 * np.abs(level))[:, None]  # in per-window units
    assert error.max() < 1e-3


def test_the_pretraining_batches_are_finite_and_masked():
    corpus = _synthetic(6)
    context, mask, anchor, target, valid = BatchMaker(corpus, seed=0).batch(64)
    for tensor in (context, mask, anchor, target, valid):
        assert torch.isfinite(tensor).all()
    assert context.shape == mask.shape == (64, BASE_CONTEXT)
    assert ((target != 0) <= (valid > 0)).all()  # no target past a series' end


def test_the_shipped_weights_are_the_ones_their_provenance_names():
    provenance = read_provenance()
    assert sha256(WEIGHTS) == provenance["sha256"]
    assert "M1" in provenance["held_out"]
    assert provenance["command"].startswith("python -m onnxcast.pipeline.pretrained build")
    assert WEIGHTS.stat().st_size < 20e6
    state, _ = load_weights()
    assert all(torch.isfinite(v).all() for v in state.values())


@pytest.fixture(scope="module")
def zero_shot_run(tiny_config):
    """The base family alone, zero-shot (--base-finetune-minutes 0), through every step; the report
    whether or not it passed its gates."""
    from onnxcast.base.errors import GateError
    from onnxcast.base.files import read_json
    from onnxcast.pipeline import run as pipeline

    cfg = tiny_config(models="base", base_finetune_minutes=0.0)
    pipeline.prepare_data(cfg)
    for step in (pipeline.train_family, pipeline.export_family, pipeline.optimize_family, pipeline.validate_family):
        step(cfg, "base")
    try:
        return cfg, pipeline.assemble_report(cfg, ["base"])
    except GateError:
        return cfg, read_json(cfg.layout.failed_report)


def test_a_zero_shot_base_run_is_judged_and_carries_its_provenance(zero_shot_run):
    cfg, report = zero_shot_run
    entry = next(m for m in report["models"] if m["family"] == "base")
    assert entry["training"]["use"] == "zero-shot"
    assert entry["training"]["pretrained"]["sha256"] == read_provenance()["sha256"]
    assert {v["name"] for v in entry["variants"]} >= {"fp32", "int8"}
    assert entry["fp32_holdout_mae"] > 0
    metadata = read_metadata(onnx.load(cfg.layout.onnx("base"), load_external_data=False))
    assert json.loads(metadata[BASE_PROVENANCE_METADATA])["sha256"] == read_provenance()["sha256"]
    assert metadata["base_use"] == "zero-shot"


def test_series_too_short_for_a_training_window_get_the_pretrained_model_zero_shot(tmp_path):
    """A fleet of 24-month series, horizon 6 and season 12: no training window, so the default
    fine-tuning is skipped and the shipped weights are used as they are."""
    import pandas as pd

    from onnxcast.base.files import read_json
    from onnxcast.pipeline import fleet_quality
    from onnxcast.pipeline import run as pipeline
    from onnxcast.pipeline.config import PipelineConfig

    rng = np.random.default_rng(0)
    dates = pd.date_range(end="2000-01-01", periods=24, freq="MS").strftime("%Y-%m-%d")
    frame = pd.concat(pd.DataFrame({"unique_id": f"s{i}", "ds": dates,
                                    "y": 100 + 10 * np.sin(np.arange(24) * np.pi / 6) + rng.normal(0, 2, 24) + i})
                      for i in range(12))
    frame.to_csv(tmp_path / "short.csv", index=False)
    cfg = PipelineConfig.from_dict({"data_uri": str(tmp_path / "short.csv"), "out_dir": str(tmp_path / "run"),
                                    "series_column": "unique_id", "models": "base", "horizon": 6, "lookback": 12,
                                    "season": 12, "freq": "MS", "quality": {"min_holdout_windows": 1}})
    assert cfg.base_finetune_minutes > 0
    for shard in fleet_quality.check_fleet_table(cfg):
        fleet_quality.check_fleet_shard(cfg, shard)
    fleet_quality.merge_fleet_checks(cfg)
    pipeline.train_family(cfg, "base")
    document = read_json(cfg.layout.model_json("base"))
    assert document["use"] == "zero-shot"
    assert document["training"]["epochs"] == 0


def test_a_series_long_enough_fine_tunes_the_shipped_weights(tiny_config):
    """One epoch from the shipped weights; the pretrained model competes as epoch 0."""
    from onnxcast.base.files import read_json
    from onnxcast.pipeline import run as pipeline

    cfg = tiny_config(models="base", max_epochs=1, base_finetune_minutes=0.5)
    pipeline.prepare_data(cfg)
    pipeline.train_family(cfg, "base")
    document = read_json(cfg.layout.model_json("base"))
    assert document["use"] == "fine-tuned"
    assert document["training"]["epochs"] == 1
    assert document["training"]["best_validation_loss"] <= document["training"]["initial_validation_loss"]
    assert document["pretrained"]["sha256"] == read_provenance()["sha256"]
