"""FleetData (ragged series back to back), the per-series split from the end, and the shards,
on real M3 monthly series."""

from __future__ import annotations

import numpy as np
import pytest

from onnxcast.base.errors import DataError
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.fleet_data import FleetData, assign_shards, split_fleet
from tests.real_panels import load_panel


@pytest.fixture(scope="module")
def panel():
    return load_panel("m3-monthly", limit=40, seed=2)


@pytest.fixture(scope="module")
def fleet(panel) -> FleetData:
    import pandas as pd

    groups = dict(tuple(panel.frame.groupby("unique_id", sort=True)))
    ids = sorted(groups)
    lengths = np.array([len(groups[i]) for i in ids])
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = np.concatenate([groups[i]["y"].to_numpy(np.float32) for i in ids])[:, None]
    starts = np.array([pd.Timestamp(groups[i]["ds"].iloc[0]).value for i in ids], dtype=np.int64)
    return FleetData(values=values, offsets=offsets, starts=starts, ids=tuple(ids), columns=("y",), freq="MS",
                     season=12, source="m3", sha256="0" * 64)


def test_save_and_load_round_trip_memory_mapped(fleet, tmp_path):
    fleet.save(tmp_path / "fleet")
    loaded = FleetData.load(tmp_path / "fleet", mmap=True)
    assert isinstance(loaded.values, np.memmap)
    assert loaded.ids == fleet.ids and loaded.freq == "MS" and loaded.season == 12
    np.testing.assert_array_equal(loaded.values, fleet.values)
    np.testing.assert_array_equal(loaded.offsets, fleet.offsets)


def test_timestamps_come_back_from_the_start_and_the_frequency(fleet, panel):
    i = 3
    rows = panel.frame[panel.frame["unique_id"] == fleet.ids[i]]
    assert [str(t)[:10] for t in fleet.timestamps(i)] == list(rows["ds"])
    assert str(fleet.end(i))[:10] == "2000-01-01"  # the panel is end-aligned


def test_subset_and_concat_give_back_the_fleet(fleet):
    parts = [fleet.subset(index) for index in assign_shards(fleet.lengths, 3)]
    merged = FleetData.concat(parts)
    assert merged.ids == fleet.ids
    np.testing.assert_array_equal(merged.values, fleet.values)
    np.testing.assert_array_equal(merged.offsets, fleet.offsets)
    np.testing.assert_array_equal(merged.starts, fleet.starts)


def test_concat_of_nothing_is_refused(fleet):
    with pytest.raises(DataError, match="no series left"):
        FleetData.concat([fleet.subset([])])


def test_shards_balance_rows_and_cover_every_series_once(fleet):
    shards = assign_shards(fleet.lengths, 4)
    assert sorted(np.concatenate(shards).tolist()) == list(range(fleet.n_series))
    rows = [int(fleet.lengths[s].sum()) for s in shards]
    assert max(rows) - min(rows) <= fleet.lengths.max()
    assert len(assign_shards(fleet.lengths[:2], 8)) == 2 and len(assign_shards(fleet.lengths, 0)) == 1


def test_every_series_is_split_from_its_own_end(fleet, panel):
    cfg = PipelineConfig.from_dict({**panel.settings(), "data_uri": "m3.csv", "out_dir": "out"})
    split = split_fleet(fleet.lengths, cfg)
    assert split.holdout_steps == panel.horizon and split.validation_steps == panel.horizon
    np.testing.assert_array_equal(split.lengths - split.validation_end, panel.horizon)
    np.testing.assert_array_equal(split.validation_end - split.train_end, panel.horizon)
    summary = split.as_dict()
    assert summary["holdout_rows"] == panel.horizon * fleet.n_series
    assert summary["rows"] == len(fleet.values)


@pytest.mark.parametrize("series_column", ["", "unique_id"])
def test_the_run_is_judged_by_the_series_it_saved_not_by_the_input_form(fleet, tmp_path, series_column):
    """Issue 31: one series is judged over its origins and two or more across series, whether
    the input was a one-series file or a long table (``series_column``): the sample decides."""
    from onnxcast.pipeline.judging import ACROSS_SERIES, OVER_ORIGINS
    from onnxcast.pipeline.run import judging

    cfg = PipelineConfig(data_uri="x", out_dir=str(tmp_path), horizon=18, lookback=36, series_column=series_column)
    fleet.subset([0]).save(cfg.layout.fleet)
    assert judging(cfg) == OVER_ORIGINS
    fleet.subset([0, 1]).save(cfg.layout.fleet)
    assert judging(cfg) == ACROSS_SERIES


def test_a_report_says_how_it_was_judged_and_an_older_one_is_read_by_its_shape():
    """Issue 31: readers route on the report's ``judging``, not on whether a ``fleet`` object is
    there; a report written before the field falls back to its shape."""
    from onnxcast.pipeline.judging import ACROSS_SERIES, OVER_ORIGINS, report_judging
    from onnxcast.registry.tracking import is_fleet_report

    written = [{"judging": OVER_ORIGINS, "fleet": {"n_series": 2}}, {"judging": ACROSS_SERIES}]
    assert [report_judging(r) for r in written] == [OVER_ORIGINS, ACROSS_SERIES]
    assert [is_fleet_report(r) for r in written] == [False, True]
    older = [{"fleet": {"n_series": 2}}, {"fleet": None}, {}]
    assert [report_judging(r) for r in older] == [ACROSS_SERIES, OVER_ORIGINS, OVER_ORIGINS]
