import pytest

from onnxcast.config import PipelineConfig
from onnxcast.errors import ConfigError


def test_defaults_are_valid():
    cfg = PipelineConfig(data_uri="x.csv", out_dir="out")
    assert cfg.models == ("lstm", "transformer")
    assert cfg.n_features == 1


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"horizon": 0}, "horizon must be >= 1, got 0"),
        ({"lookback": 1}, "lookback must be >= 2"),
        ({"models": ("lstm", "gru")}, "'gru'"),
        ({"holdout_fraction": 0.7}, "holdout_fraction must be in (0, 0.5), got 0.7"),
        ({"d_model": 30, "n_heads": 4}, "d_model (30) must be divisible by n_heads (4)"),
        ({"feature_columns": ("y",)}, "target column 'y' is also listed as a feature"),
        ({"time_column": "y"}, "time column and target column are both 'y'"),
        ({"max_minutes": 0}, "max_minutes must be > 0"),
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
