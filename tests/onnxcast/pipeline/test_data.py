import numpy as np
import pandas as pd
import pytest

from onnxcast.base.errors import DataError
from onnxcast.pipeline.config import PipelineConfig, QualitySettings
from onnxcast.pipeline.data import (
    dated_split,
    parse_utc,
    utc_iso,
    windows,
)
from onnxcast.pipeline.fleet_data import FleetData, split_fleet
from onnxcast.pipeline.fleet_quality import check_in_process
from onnxcast.pipeline.judging import ACROSS_SERIES, OVER_ORIGINS, judging_for
from onnxcast.pipeline.seasons import season_for_freq

SMALL = {"lookback": 24, "horizon": 6}


def cfg_for(path, **overrides) -> PipelineConfig:
    return PipelineConfig(data_uri=str(path), out_dir="unused", **{**SMALL, **overrides})


def gate_series(cfg: PipelineConfig):
    """The series the pipeline trains on: what the data-quality gate passed, nothing else."""
    import tempfile
    from dataclasses import replace

    with tempfile.TemporaryDirectory() as out:
        cfg = replace(cfg, out_dir=out)
        check_in_process(cfg)
        return FleetData.load(cfg.layout.fleet)


def write_csv(tmp_path, frame: pd.DataFrame, name="data.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return path


def hourly(n=400, start="2024-01-01"):
    ts = pd.date_range(start, periods=n, freq="h")
    y = 100 + 10 * np.sin(np.arange(n) * 2 * np.pi / 24)
    return pd.DataFrame({"ds": ts.strftime("%Y-%m-%d %H:%M:%S"), "y": y})


def test_example_data_loads_as_a_regular_hourly_series(example_csv):
    series = gate_series(cfg_for(example_csv))
    assert series.values.shape == (3600, 1)
    assert series.values.dtype == np.float32
    assert series.freq == "h" and series.season == 24
    assert len(series.sha256) == 64
    assert np.all(np.diff(series.timestamps(0)).astype("timedelta64[h]").astype(int) == 1)


def test_other_column_names_features_and_parquet(tmp_path):
    frame = hourly().rename(columns={"ds": "when", "y": "load"})
    frame["temp"] = np.linspace(0, 1, len(frame))
    path = tmp_path / "d.parquet"
    frame.to_parquet(path)
    series = gate_series(cfg_for(path, time_column="when", target_column="load", feature_columns=("temp",)))
    assert series.columns == ("load", "temp")
    assert series.values.shape == (400, 2)
    assert series.values[-1, 1] == pytest.approx(1.0)


def test_timezones_are_normalised_to_utc(tmp_path):
    frame = hourly(100)
    frame["ds"] = pd.date_range("2024-01-01", periods=100, freq="h", tz="Europe/Berlin").astype(str)
    series = gate_series(cfg_for(write_csv(tmp_path, frame)))
    assert str(series.timestamps(0)[0]) == "2023-12-31T23:00:00.000000000"


def test_trained_until_drops_later_rows(tmp_path):
    series = gate_series(cfg_for(write_csv(tmp_path, hourly(200)), trained_until="2024-01-04T00:00:00"))
    assert len(series.values) == 73


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda f: f.drop(columns=["y"]), "required columns ['ds', 'y'] present: missing ['y']"),
        (lambda f: f.assign(y=f.y.astype(object).where(f.index != 5, "twelve")), "'twelve' (row 6)"),
        (lambda f: pd.concat([f.iloc[:10], f.iloc[9:10], f.iloc[10:]]), "timestamps unique"),
        (lambda f: f.drop(index=[20, 21]), "longest 2 steps"),
        (lambda f: f.assign(ds=f.ds.where(f.index != 7, "not a date")), "'not a date' (row 8)"),
        (lambda f: f.assign(ds=f.ds.where(f.index != 7, "2024-01-01 07:30:00")), "on the regular 'h' grid"),
        (lambda f: f.assign(y=f.y.where(f.index != 3, np.inf)), "finite and within float32 range"),
    ],
)
def test_bad_tables_are_refused_by_the_gate_naming_the_problem(tmp_path, mutate, fragment):
    path = write_csv(tmp_path, mutate(hourly()))
    with pytest.raises(DataError) as err:
        gate_series(cfg_for(path, freq="h"))
    message = str(err.value)
    assert message.startswith(str(path))
    assert fragment in message
    assert "\n" not in message


def test_rows_out_of_time_order_are_sorted_with_a_warning(tmp_path):
    """changes-31.md 16: one series as a fleet's: rows out of order are sorted, not refused."""
    forward = gate_series(cfg_for(write_csv(tmp_path, hourly(), "forward.csv"), freq="h"))
    backward = gate_series(cfg_for(write_csv(tmp_path, hourly().iloc[::-1], "backward.csv"), freq="h"))
    np.testing.assert_array_equal(backward.values, forward.values)
    assert backward.starts.tolist() == forward.starts.tolist()


def test_split_and_dataset_timestamps_are_utc_with_z():
    """Issue 9: report.json mixed '...Z' (dataset) and naive ISO strings (split)."""
    stamps = (np.datetime64("2024-03-01T00:00:00") + np.arange(400) * np.timedelta64(1, "h")).astype("datetime64[ns]")
    split = split_fleet(np.array([400]), PipelineConfig(data_uri="x", out_dir="o", **SMALL))
    for key in ("train_end", "validation_end", "holdout_start", "holdout_end"):
        assert dated_split(split, stamps)[key].endswith("Z")
    assert utc_iso(stamps[0]) == "2024-03-01T00:00:00Z"


def test_parse_utc_reads_what_utc_iso_writes_and_converts_offsets():
    """One pair of helpers for report and metadata timestamps (the monitor reads trained_until)."""
    moment = np.datetime64("2024-03-01T05:00:00", "ns")
    assert parse_utc(utc_iso(moment)) == moment
    assert parse_utc("2024-03-01T07:00:00+02:00") == moment == parse_utc("2024-03-01T05:00:00")
    assert parse_utc("2024-03-01").dtype == np.dtype("datetime64[ns]")


def test_repairs_only_on_request(tmp_path):
    frame = hourly().drop(index=[20, 21])
    path = write_csv(tmp_path, frame)
    with pytest.raises(DataError):
        gate_series(cfg_for(path))
    repaired = gate_series(cfg_for(path, quality=QualitySettings(fill_gaps_max_steps=2)))
    assert len(repaired.values) == 400
    assert np.isfinite(repaired.values).all()
    duplicated = write_csv(tmp_path, pd.concat([hourly().iloc[:10], hourly().iloc[9:]]), "dup.csv")
    kept = gate_series(cfg_for(duplicated, quality=QualitySettings(drop_duplicate_timestamps=True)))
    assert len(kept.values) == 400


@pytest.mark.parametrize(("freq", "season"), [("h", 24), ("30min", 48), ("15min", 96), ("D", 7),
                                              ("W-SUN", 52), ("MS", 12), ("QS", 4), ("YS", 1), ("B", 5)])
def test_season_follows_frequency(freq, season):
    assert season_for_freq(freq) == season


def test_split_is_time_ordered_and_holds_whole_horizons():
    cfg = PipelineConfig(data_uri="x", out_dir="o", horizon=24, lookback=168)
    split = split_fleet(np.array([3600]), cfg)
    assert 0 < split.train_end[0] < split.validation_end[0] < split.lengths[0] == 3600
    assert split.lengths[0] - split.validation_end[0] == 540
    with pytest.raises(DataError, match="too few"):
        split_fleet(np.array([300]), cfg)


def test_one_series_holds_out_a_share_of_its_rows_many_one_horizon_each():
    """The holdout follows how the run is judged: one series over its many origins (15% of 3,600
    rows), a fleet across series (min_holdout_windows horizons each), whatever the lengths."""
    cfg = PipelineConfig(data_uri="x", out_dir="o", horizon=24, lookback=168)
    assert (judging_for(1), judging_for(2), judging_for(10_000)) == (OVER_ORIGINS, ACROSS_SERIES, ACROSS_SERIES)
    one = split_fleet(np.array([3600]), cfg)
    many = split_fleet(np.array([3600, 3600]), cfg)
    assert (one.holdout_steps, one.validation_steps) == (540, 540)
    assert (many.holdout_steps, many.validation_steps) == (24 * cfg.quality.min_holdout_windows, 24)
    assert many.validation_end.tolist() == [3600 - 48, 3600 - 48]


def test_windows_cut_history_and_target_at_each_origin():
    values = np.arange(60, dtype=np.float32).reshape(30, 2)
    history, target, origins = windows(values, lookback=4, horizon=3, start=10, end=30, stride=5)
    assert origins.tolist() == [10, 15, 20, 25]
    assert history.shape == (4, 4, 2) and target.shape == (4, 3)
    assert history[0, :, 0].tolist() == [12, 14, 16, 18]  # rows 6..9, column 0
    assert target[0].tolist() == [20, 22, 24]  # rows 10..12 of the target
    assert history[1, -1, 1] == values[14, 1]


def test_series_round_trips_through_the_run_directory(tmp_path, example_csv):
    series = gate_series(cfg_for(example_csv))
    series.save(tmp_path)
    again = FleetData.load(tmp_path)
    assert np.array_equal(again.values, series.values)
    assert np.array_equal(again.timestamps(0), series.timestamps(0))
    assert again.ids == series.ids and again.n_series == 1
    assert (again.freq, again.season, again.sha256) == (series.freq, series.season, series.sha256)


def test_a_run_directory_from_before_issue_31_is_read_as_a_fleet_of_one(tmp_path, example_csv):
    """A one-series run saved data/series.npz + data/series.json (no data/fleet/): its readers
    (tracking's plot, champion/challenger's MSIS fallback) load it through load_split as the
    same series and split; a broken one is one DataError naming the file."""
    import json

    from onnxcast.pipeline.fleet_data import load_split

    cfg = cfg_for(example_csv)
    series = gate_series(cfg)
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "series.npz", values=series.values,
             timestamps=series.timestamps(0).astype("datetime64[ns]").astype("int64"))
    (data / "series.json").write_text(json.dumps({"columns": list(series.columns), "freq": series.freq,
                                                  "season": series.season, "source": series.source,
                                                  "sha256": series.sha256}))
    old, old_split = load_split(data / "fleet", cfg)
    series.save(tmp_path / "new")
    new, new_split = load_split(tmp_path / "new", cfg)
    assert np.array_equal(old.values, new.values) and np.array_equal(old.timestamps(0), new.timestamps(0))
    assert old.ids == new.ids and (old.freq, old.season, old.sha256) == (new.freq, new.season, new.sha256)
    assert np.array_equal(old_split.validation_end, new_split.validation_end)
    (data / "series.json").write_text("{}")
    with pytest.raises(DataError, match="series.npz: not a saved series of an older run"):
        load_split(data / "fleet", cfg)


def test_reads_from_s3_over_http(s3_bucket, tmp_path):
    import boto3

    body = hourly().to_csv(index=False).encode()
    boto3.client("s3").put_object(Bucket=s3_bucket, Key="in/data.csv", Body=body)
    series = gate_series(cfg_for(f"s3://{s3_bucket}/in/data.csv"))
    assert series.values.shape == (400, 1)
    with pytest.raises(DataError, match=f"s3://{s3_bucket}/in/missing.csv: cannot read from S3"):
        gate_series(cfg_for(f"s3://{s3_bucket}/in/missing.csv"))


@pytest.mark.parametrize(("freq", "seasons"), [("h", (24, 168)), ("30min", (48, 336)), ("D", (7, 365)),
                                               ("W-SUN", (52,)), ("MS", (12,)), ("QS", (4,)), ("YS", (1,)),
                                               ("B", (5, 260)), ("2h", (12, 84))])
def test_every_seasonality_the_frequency_implies(freq, seasons):
    from onnxcast.pipeline.seasons import seasons_for_freq

    assert seasons_for_freq(freq) == seasons
    assert seasons[0] == season_for_freq(freq)
