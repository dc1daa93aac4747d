import io
import logging
import sys

import numpy as np
import pytest
import torch

from onnxcast.pipeline import training
from onnxcast.pipeline.models import ModelSpec, build_model
from onnxcast.pipeline.training import (
    epoch_progress,
    evaluate_loss,
    predict,
    seed_everything,
    series_windows,
    train_model,
)


def data(seed=0, n=300, lookback=24, horizon=6):
    rng = np.random.default_rng(seed)
    t = np.arange(n + lookback + horizon)
    # a 7-step cycle the 12-step seasonal naive (the models' anchor) misses: there is something to learn
    y = (100 + 20 * np.sin(t * 2 * np.pi / 12) + 8 * np.sin(t * 2 * np.pi / 7)
         + rng.normal(0, 1, len(t))).astype(np.float32)
    x = np.stack([y[i : i + lookback] for i in range(n)])[:, :, None]
    target = np.stack([y[i + lookback : i + lookback + horizon] for i in range(n)])
    return x, target


def fit(family="lstm", seed=7, **kwargs):
    spec = ModelSpec(family=family, n_features=1, horizon=6, lookback=24, hidden_size=8, num_layers=1,
                     d_model=8, n_heads=2, season=12)
    x, y = data()
    seed_everything(seed)  # as the pipeline does: initial weights come from the seed too
    model = build_model(spec, mean=np.array([100.0]), std=np.array([14.0]))
    options = {"max_epochs": 3, "max_minutes": 5, "patience": 5, "batch_size": 32, "learning_rate": 3e-3, "seed": seed}
    options.update(kwargs)
    result = train_model(model, (x[:240], y[:240]), (x[240:], y[240:]), **options)
    return model, result


def test_same_seed_same_weights():
    a, result_a = fit(seed=3)
    b, result_b = fit(seed=3)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert result_a.history == result_b.history


def test_training_lowers_validation_loss_and_keeps_the_best_epoch():
    _, result = fit(family="transformer", max_epochs=6)
    losses = [result.initial_validation_loss] + [h["validation_loss"] for h in result.history]
    assert min(losses) < losses[0] and result.best_epoch > 0  # better than the anchor it starts at
    assert result.best_validation_loss == min(losses)
    assert result.history[result.best_epoch - 1]["validation_loss"] == result.best_validation_loss


def test_early_stopping_and_time_cap():
    _, stopped = fit(max_epochs=50, patience=1, learning_rate=0.5)  # a wild rate stops improving fast
    assert stopped.stopped == "early_stopping" and stopped.epochs < 50
    _, capped = fit(max_epochs=50, max_minutes=1e-6)
    assert capped.stopped == "max_minutes" and capped.epochs == 1


def test_predict_returns_raw_units():
    model, _ = fit(max_epochs=4)
    x, y = data(seed=1)
    forecast = predict(model, x[:10])
    assert forecast.shape == (10, 6)
    assert abs(float(forecast.mean()) - float(y[:10].mean())) < 20  # the scale of the data, not ~0


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_progress_bar_with_losses_and_best_epoch(caplog):
    terminal = FakeTerminal()
    with caplog.at_level(logging.INFO, logger="onnxcast.pipeline.training"):
        _, result = fit(max_epochs=2, progress=epoch_progress(2, "lstm", stream=terminal))
    bar = terminal.getvalue()
    assert "lstm" in bar and "2/2" in bar
    assert f"best={result.best_epoch}" in bar and "val=" in bar and "train=" in bar
    assert not [r for r in caplog.records if "epoch" in r.getMessage()]  # no log lines under the bar


def test_without_a_terminal_each_epoch_is_one_log_line(caplog, monkeypatch):
    not_a_terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", not_a_terminal)  # as in an Airflow task log or a pipe
    with caplog.at_level(logging.INFO, logger="onnxcast.pipeline.training"):
        _, result = fit(max_epochs=2)
    lines = [r.getMessage() for r in caplog.records if r.name == "onnxcast.pipeline.training"]
    assert len(lines) == 2
    assert lines[0].startswith("lstm epoch 1/2 train_loss=") and "validation_loss=" in lines[0]
    if result.best_epoch:  # epoch 0 is the model as built, before any line
        assert lines[result.best_epoch - 1].endswith("(best)")
    assert not_a_terminal.getvalue() == ""  # no bar characters in a log file


# --- issue 18: the families move off their seasonal-naive anchor ------------------------------

def _example_windows(lookback=168, horizon=24, rows=1900, train_end=1500):
    """Hourly Victoria electricity demand (the example data, a real series): training and
    validation windows of its first ``rows`` hours."""
    import pandas as pd

    from onnxcast.pipeline.config import example_data_path
    from onnxcast.pipeline.data import windows

    values = pd.read_csv(example_data_path())["y"].to_numpy(np.float32)[:rows, None]
    train = windows(values, lookback, horizon, 0, train_end)[:2]
    validation = windows(values, lookback, horizon, train_end, rows)[:2]
    return values[:train_end], train, validation


@pytest.mark.parametrize("family", ["lstm", "transformer"])
def test_each_family_moves_off_its_weekly_anchor_in_a_few_epochs(family, caplog):
    """Issue 18: with the weekly seasonal naive as anchor (the start of a one-week window), the
    LSTM's training loss stayed flat and the Transformer was stopped by patience counted from
    the untrained anchor: both shipped as the anchor (best epoch 0)."""
    from onnxcast.pipeline.config import PipelineConfig
    from onnxcast.pipeline.training import describe

    defaults = PipelineConfig(data_uri="x", out_dir="o")
    train_rows, train, validation = _example_windows()
    spec = ModelSpec(family=family, n_features=1, horizon=24, lookback=168, hidden_size=16, num_layers=1,
                     d_model=16, n_heads=2, season=168, seasons=(168, 24))
    seed_everything(defaults.seed)
    model = build_model(spec, train_rows.mean(axis=0), train_rows.std(axis=0))
    result = train_model(model, train, validation, max_epochs=4, max_minutes=5, patience=2,
                         batch_size=defaults.batch_size, learning_rate=defaults.learning_rate, seed=defaults.seed)
    assert result.best_epoch > 0, describe(result)
    assert result.best_validation_loss < 0.8 * result.initial_validation_loss, describe(result)
    assert "best epoch 0" not in describe(result)


def test_a_model_that_cannot_beat_its_anchor_says_so():
    from onnxcast.pipeline.training import TrainResult, describe

    result = TrainResult(epochs=5, best_epoch=0, best_validation_loss=0.0329, stopped="early_stopping", seconds=1.0,
                         history=[{"epoch": 1, "train_loss": 0.1, "validation_loss": 0.0445}],
                         initial_validation_loss=0.0329)
    text = describe(result)
    assert "best epoch 0, the untrained seasonal-naive anchor" in text and "0.0445" in text
    assert "baseline gate will exclude it" in text


def test_patience_counts_from_the_best_trained_epoch_not_from_the_anchor():
    """Issue 18: patience counted from epoch 0 (the untrained anchor) stopped the Transformer at
    epoch 5 while its validation loss was still falling, all of it above the anchor's."""
    # the first two epochs are worse than the anchor, and then training improves on it
    _, result = fit(family="transformer", max_epochs=8, patience=2, learning_rate=0.03)
    losses = [h["validation_loss"] for h in result.history]
    assert losses[0] > result.initial_validation_loss and losses[1] > result.initial_validation_loss
    assert result.epochs > 2  # counted from epoch 0, patience 2 stopped here, at the anchor
    trained_best = 1 + losses.index(min(losses))
    assert result.epochs == min(8, trained_best + 2)  # two epochs without a better TRAINED epoch
    assert result.best_epoch > 0 and result.best_validation_loss < result.initial_validation_loss


# --- issue 23: training throughput (bench/training.py measures it) ---------------------------

needs_bf16 = pytest.mark.skipif(not training.bf16_supported(), reason="this CPU has no bf16 units (AMX, AVX512-BF16)")


@needs_bf16
def test_bf16_training_gives_the_same_weights_twice_and_says_so():
    a, result_a = fit(family="lstm", seed=5, bf16=True)
    b, result_b = fit(family="lstm", seed=5, bf16=True)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert all(p.dtype == torch.float32 for p in a.parameters())  # autocast computes in bf16, weights stay float32
    assert result_a.history == result_b.history
    assert result_a.precision == "bfloat16-autocast"
    float32, result_f = fit(family="lstm", seed=5)
    assert result_f.precision == "float32"
    assert not all(torch.equal(pa, pf) for pa, pf in zip(a.state_dict().values(), float32.state_dict().values(),
                                                     strict=True))


def test_without_bf16_units_bf16_training_falls_back_to_float32(monkeypatch):
    reference, result_f = fit(family="lstm", seed=4)
    monkeypatch.setattr(training, "bf16_supported", lambda: False)
    model, result = fit(family="lstm", seed=4, bf16=True)
    assert result.precision == "float32" and result.history == result_f.history
    for (name, pa), pb in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name


@needs_bf16
def test_validation_loss_of_bf16_training_is_float32():
    """The best validation loss is the float32 loss of the weights kept, not an autocast one."""
    model, result = fit(family="lstm", seed=6, bf16=True, max_epochs=2)
    x, y = data()
    assert result.best_validation_loss == evaluate_loss(model, torch.from_numpy(x[240:]), torch.from_numpy(y[240:]),
                                                        32 * 4)


def test_training_windows_are_views_of_the_series_and_train_the_same_weights_as_copies():
    """data.windows copies every window (the series lookback times over); series_windows shares
    the series' memory, and training on it gives the same weights as on the copies."""
    from onnxcast.pipeline.data import windows

    values = _example_windows(rows=800, train_end=800)[0]  # 800 hours of the example, float32 [800, 1]
    history, target = series_windows(values, 168, 24, 0, 700)
    copied_history, copied_target, _ = windows(values, 168, 24, 0, 700)
    assert np.array_equal(history.numpy(), copied_history) and np.array_equal(target.numpy(), copied_target)
    for view in (history, target):  # the series' own buffer, nothing more
        assert view.untyped_storage().data_ptr() == values.ctypes.data
        assert view.untyped_storage().nbytes() == values.nbytes
    assert copied_history.nbytes > 100 * values.nbytes  # what the copies cost

    spec = ModelSpec(family="nhits", n_features=1, horizon=24, lookback=168, hidden_size=8, season=168,
                     seasons=(168, 24))
    weights = []
    for train in ((copied_history, copied_target), (history, target)):
        seed_everything(1)
        model = build_model(spec, values.mean(axis=0), values.std(axis=0))
        train_model(model, train, series_windows(values, 168, 24, 700, 800), max_epochs=2, max_minutes=5,
                    patience=5, batch_size=64, learning_rate=2e-3, seed=1)
        weights.append(model.state_dict())
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


def test_bf16_training_trains_the_lstm_in_bf16_where_the_cpu_has_the_units(tmp_path):
    """float32 by default; bf16_training: the families of training.BF16_FAMILIES in bf16 autocast
    where the CPU has bf16 units. model.json records what ran."""
    from real_series import TINY_SETTINGS, weekly_co2_csv

    from onnxcast.base.files import read_json
    from onnxcast.pipeline import run as pipeline
    from onnxcast.pipeline.config import PipelineConfig

    settings = {**TINY_SETTINGS, "data_uri": weekly_co2_csv(), "out_dir": str(tmp_path / "run"), "max_epochs": 1,
                "hidden_size": 8, "num_layers": 1, "models": ["lstm", "dlinear"]}
    cfg = PipelineConfig.from_dict(settings)
    pipeline.prepare_data(cfg)
    precision = {}
    for bf16_training in (False, True):
        run = PipelineConfig.from_dict({**settings, "bf16_training": bf16_training})
        for family in ("lstm", "dlinear"):
            pipeline.train_family(run, family)
            precision[family, bf16_training] = read_json(run.layout.model_json(family))["training"]["precision"]
    lstm = "bfloat16-autocast" if training.bf16_supported() else "float32"
    assert precision == {("lstm", False): "float32", ("dlinear", False): "float32",
                         ("lstm", True): lstm, ("dlinear", True): "float32"}
