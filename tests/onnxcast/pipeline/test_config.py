import pytest

from onnxcast.base.errors import ConfigError
from onnxcast.pipeline.config import QUALITY_RANGES, RANGES, PipelineConfig, QualitySettings


def test_defaults_are_valid():
    cfg = PipelineConfig(data_uri="x.csv", out_dir="out")
    assert cfg.models == ("lstm", "transformer", "nhits", "dlinear")
    assert cfg.n_features == 1


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"horizon": 0}, "horizon must be in [1, 10000], got 0"),
        ({"lookback": 1}, "lookback must be in [2, 100000], got 1"),
        ({"models": ("lstm", "gru")}, "'gru'"),
        ({"holdout_fraction": 0.7}, "holdout_fraction must be in (0, 0.5), got 0.7"),
        ({"d_model": 30, "n_heads": 4}, "d_model (30) must be divisible by n_heads (4)"),
        ({"feature_columns": ("y",)}, "target column 'y' is also listed as a feature"),
        ({"time_column": "y"}, "time column and target column are both 'y'"),
        ({"max_minutes": 0}, "max_minutes must be in (0, 10080], got 0"),
        # each of these crashed (ZeroDivisionError) or was accepted before: issue 9
        ({"n_heads": 0}, "n_heads must be in [1, 1024], got 0"),
        ({"batch_size": 0}, "batch_size must be in [1, 1000000], got 0"),
        ({"patience": 0}, "patience must be in [1, 100000], got 0"),
        ({"latency_repeats": 0}, "latency_repeats must be in [1, 100000], got 0"),
        ({"d_model": 64, "n_heads": 5}, "d_model (64) must be divisible by n_heads (5)"),
        ({"max_minutes": float("nan")}, "max_minutes must be finite, got nan"),
        ({"learning_rate": float("inf")}, "learning_rate must be finite, got inf"),
        ({"horizon": True}, "horizon must be an integer, got True"),
        ({"horizon": "24"}, "horizon must be an integer, got '24'"),
        ({"hidden_size": 2.5}, "hidden_size must be an integer, got 2.5"),
        ({"accuracy_budget": -0.1}, "accuracy_budget must be in [0, 1], got -0.1"),
        ({"seed": -1}, "seed must be in [0, 4294967295], got -1"),
        ({"opset": 7}, "opset must be in [14, 30], got 7"),
        ({"trained_until": "last tuesday"}, "trained_until must be an ISO timestamp, got 'last tuesday'"),
    ],
)
def test_bad_settings_name_the_setting(values, fragment):
    with pytest.raises(ConfigError) as err:
        PipelineConfig(data_uri="x.csv", out_dir="out", **values)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_from_dict_accepts_comma_separated_lists_and_rejects_unknown_keys():
    cfg = PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": "o", "models": "transformer, lstm",
                                    "feature_columns": "temp,hour"})
    assert cfg.models == ("transformer", "lstm")
    assert cfg.feature_columns == ("temp", "hour")
    with pytest.raises(ConfigError, match="unknown setting.*lookbak"):
        PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": "o", "lookbak": 3})
    with pytest.raises(ConfigError, match="unknown quality setting.*bogus"):
        PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": "o", "quality": {"bogus": 1}})


def test_save_and_load_round_trip(tmp_path):
    cfg = PipelineConfig(data_uri="x.csv", out_dir="o", feature_columns=("a",), horizon=7)
    cfg.save(tmp_path / "c.json")
    assert PipelineConfig.load(tmp_path / "c.json") == cfg


@pytest.mark.parametrize("name", sorted(n for n, r in RANGES.items() if r.kind is not bool))
def test_every_numeric_setting_has_its_range_checked(name):
    """Zero, a negative number, NaN, a string and a bool: each is refused by name, or valid."""
    kind = RANGES[name][0]
    for bad in (-1, float("nan"), "3", True):
        with pytest.raises(ConfigError, match=rf"\b{name} must be"):
            PipelineConfig(data_uri="x.csv", out_dir="out", **{name: bad})
    if kind is int:
        with pytest.raises(ConfigError, match=rf"\b{name} must be"):
            PipelineConfig(data_uri="x.csv", out_dir="out", **{name: 1.5})


@pytest.mark.parametrize("name", sorted(n for n, r in RANGES.items() if r.kind is bool))
def test_every_switch_is_true_or_false(name):
    for bad in (0, 1, "true", None):
        with pytest.raises(ConfigError, match=rf"\b{name} must be true or false"):
            PipelineConfig(data_uri="x.csv", out_dir="out", **{name: bad})


def test_every_numeric_field_is_in_the_range_table():
    import dataclasses

    numeric = {f.name for f in dataclasses.fields(PipelineConfig)
               if f.type in ("int", "float", "int | None", "float | None", "bool")}
    assert numeric == set(RANGES)
    quality = {f.name for f in dataclasses.fields(QualitySettings)}
    assert quality == set(QUALITY_RANGES)


@pytest.mark.parametrize("family", ["lstm", "transformer", "nhits", "dlinear"])
def test_the_size_estimate_counts_the_parameters_the_model_has(family):
    """The settings check bounds a model by its estimated size: the estimate is the real count
    (window families: an upper bound, they may anchor on fewer seasons)."""
    from onnxcast.pipeline.config import estimate_model_size
    from onnxcast.pipeline.models import ModelSpec, build_model

    cfg = PipelineConfig(data_uri="x.csv", out_dir="out", feature_columns=("temp",), hidden_size=24, num_layers=3,
                         d_model=32, n_heads=4, lookback=96, horizon=12, models=(family,))
    spec = ModelSpec(family=family, n_features=2, horizon=12, lookback=96, hidden_size=24, num_layers=3, d_model=32,
                     n_heads=4, season=24, seasons=(24, 48, 96),
                     patch=cfg.sequence_patch if family in ("lstm", "transformer") else 1)
    actual = sum(p.numel() for p in build_model(spec).parameters())
    assert estimate_model_size(family, cfg)[0] == actual


@pytest.mark.parametrize(("values", "fragment"), [
    ({"max_missing_fraction": 1.0}, "quality.max_missing_fraction must be in [0, 1), got 1.0"),
    ({"outlier_mad_threshold": 0}, "quality.outlier_mad_threshold must be in (0, inf], got 0"),
    ({"min_holdout_windows": 0}, "quality.min_holdout_windows must be in [1, 10000], got 0"),
    ({"fill_gaps_max_steps": -2}, "quality.fill_gaps_max_steps must be in [0, 1000000], got -2"),
    ({"drop_duplicate_timestamps": "yes"}, "quality.drop_duplicate_timestamps must be true or false, got 'yes'"),
])
def test_bad_quality_settings_name_the_setting(values, fragment):
    with pytest.raises(ConfigError) as err:
        PipelineConfig.from_dict({"data_uri": "x.csv", "out_dir": "o", "quality": values})
    assert fragment in str(err.value)


@pytest.mark.parametrize(("argv", "fragment"), [
    (["--n-heads", "0"], "n_heads must be in [1, 1024], got 0"),
    (["--batch-size", "0"], "batch_size must be in [1, 1000000], got 0"),
    (["--patience", "0"], "patience must be in [1, 100000], got 0"),
    (["--latency-repeats", "0"], "latency_repeats must be in [1, 100000], got 0"),
    (["--d-model", "30"], "d_model (30) must be divisible by n_heads (4)"),
    # passed the settings check, then failed after 19 s with an allocation traceback (exit 1)
    (["--models", "nhits", "--hidden-size", "65536"], "hidden_size must be in [1, 4096], got 65536"),
    (["--models", "nhits", "--hidden-size", "2048"],
     "hidden_size 2,048 makes the nhits model about 822,248,032 parameters (13.2 GB to train), over the limit "
     "of 50,000,000: use hidden_size 489 or less with these settings"),
    (["--models", "lstm", "--hidden-size", "4096"], "hidden_size 4,096 makes the lstm model about"),
    (["--models", "transformer", "--lookback", "20000", "--patch-length", "1"],
     "lookback 20,000 makes the transformer model about 2,457.6 GB of attention scores per batch"),
    (["--models", "dlinear", "--lookback", "100000", "--horizon", "1000"], "use lookback 23,497 or less"),
    (["--baseline-margin", "1.5"], "baseline_margin must be in [0, 1)"),
    (["--champion-metric", "crps"], "champion_metric must be one of ['mase', 'msis'], got 'crps'"),
])
def test_bad_settings_through_the_cli_exit_2_with_one_line(tmp_path, capsys, argv, fragment):
    from onnxcast import cli

    code = cli.main(["pipeline", "--data", "example", "--out", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: invalid settings: ") and fragment in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()
