"""Long tables (fleet mode): one CSV or Parquet file, or a folder / s3:// prefix of Parquet
parts, read into one frame with categorical series ids and one digest for the data set."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from onnxcast.base.errors import DataError
from onnxcast.pipeline.config import PipelineConfig
from onnxcast.pipeline.fleet_data import FleetData
from onnxcast.pipeline.fleet_quality import check_fleet_shard, check_fleet_table, merge_fleet_checks
from onnxcast.pipeline.reading import list_parquet_parts, read_long_table
from tests.real_panels import load_panel

COLUMNS = ["unique_id", "ds", "y"]


@pytest.fixture(scope="module")
def panel():
    return load_panel("m3-monthly", limit=60, seed=1)


def _write_parts(frame: pd.DataFrame, folder) -> list:
    """Three Parquet parts of whole series (as a Spark or Dask job would write them), plus the
    files such jobs leave that are not data."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = sorted(frame["unique_id"].unique())
    paths = []
    for k, chunk in enumerate(np.array_split(np.array(ids, dtype=object), 3)):
        path = folder / f"part-{k:05d}.parquet"
        frame[frame["unique_id"].isin(set(chunk))].to_parquet(path, index=False)
        paths.append(path)
    (folder / "_SUCCESS").write_text("")
    (folder / ".part-00000.parquet.crc").write_text("crc")
    return paths


def _digest(folder, names) -> str:
    listed = [[name, hashlib.sha256((folder / name).read_bytes()).hexdigest()] for name in names]
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()


def _sorted(frame) -> pd.DataFrame:
    out = frame[COLUMNS].astype({"unique_id": str, "ds": str}).sort_values(["unique_id", "ds"])
    return out.reset_index(drop=True)


def test_a_folder_of_parts_reads_as_one_table_with_one_digest(panel, tmp_path):
    folder = tmp_path / "panel"
    _write_parts(panel.frame, folder)
    raw = read_long_table(str(folder), columns=COLUMNS, series_column="unique_id")
    names = [f"part-{k:05d}.parquet" for k in range(3)]
    assert [name for name, _ in list_parquet_parts(str(folder))] == names  # _SUCCESS, hidden files skipped
    assert raw.sha256 == _digest(folder, names)
    assert raw.n_bytes == sum((folder / n).stat().st_size for n in names)
    assert raw.frame["unique_id"].dtype == "category"
    pd.testing.assert_frame_equal(_sorted(raw.frame), _sorted(panel.frame))
    # a changed part changes the data set's digest
    part = pd.read_parquet(folder / names[1])
    part.loc[0, "y"] += 1.0
    part.to_parquet(folder / names[1], index=False)
    assert read_long_table(str(folder), columns=COLUMNS, series_column="unique_id").sha256 != raw.sha256


@pytest.mark.slow
def test_csv_parquet_and_a_folder_give_the_same_fleet(panel, tmp_path):
    sources = {"csv": tmp_path / "m3.csv", "parquet": tmp_path / "m3.parquet", "folder": tmp_path / "parts"}
    panel.frame.to_csv(sources["csv"], index=False)
    panel.frame.to_parquet(sources["parquet"], index=False)
    _write_parts(panel.frame, sources["folder"])
    fleets, digests = {}, {}
    for kind, path in sources.items():
        cfg = PipelineConfig.from_dict({**panel.settings(fleet_shards=2), "data_uri": str(path),
                                        "out_dir": str(tmp_path / f"out-{kind}")})
        for shard in check_fleet_table(cfg):
            check_fleet_shard(cfg, shard)
        digests[kind] = merge_fleet_checks(cfg)["dataset"]["sha256"]
        fleets[kind] = FleetData.load(cfg.layout.fleet)
    first = fleets["csv"]
    for kind, fleet in fleets.items():
        assert fleet.ids == first.ids, kind
        np.testing.assert_array_equal(fleet.values, first.values)
        np.testing.assert_array_equal(fleet.offsets, first.offsets)
        np.testing.assert_array_equal(fleet.starts, first.starts)
    assert digests["csv"] == hashlib.sha256(sources["csv"].read_bytes()).hexdigest()
    assert digests["parquet"] == hashlib.sha256(sources["parquet"].read_bytes()).hexdigest()
    assert digests["folder"] == _digest(sources["folder"], [f"part-{k:05d}.parquet" for k in range(3)])


def test_series_ids_stay_text(tmp_path):
    path = tmp_path / "ids.csv"
    path.write_text("unique_id,ds,y\n007,2000-01-01,1\n007,2000-02-01,2\n10,2000-01-01,3\n")
    frame = read_long_table(str(path), columns=COLUMNS, series_column="unique_id").frame
    assert list(frame["unique_id"].cat.categories) == ["007", "10"]


def test_ids_that_look_missing_or_numeric_stay_ids_whatever_the_header_spacing(tmp_path):
    """NA is North America (or Namibia), not a missing id; 'meter ' with a trailing space is
    still the series column, so 007 and 7 stay two series; an empty id is missing."""
    data = tmp_path / "fleet.csv"
    data.write_text("meter ,ds,y\nNA,2000-01-01,1\nNone,2000-01-01,NA\n007,2000-01-01,2\n7,2000-01-01,3\n"
                    ",2000-01-01,4\n")
    frame = read_long_table(str(data), columns=["meter", "ds", "y"], series_column="meter").frame
    assert list(frame["meter"].astype(object).where(frame["meter"].notna(), None)) == ["NA", "None", "007", "7", None]
    assert frame["y"].isna().tolist() == [False, True, False, False, False]  # NA is still missing as a value


def test_the_size_limit_holds_over_the_sum_of_parts(panel, tmp_path, monkeypatch):
    paths = _write_parts(panel.frame, tmp_path / "panel")
    sizes = [p.stat().st_size for p in paths]
    monkeypatch.setenv("ONNXCAST_MAX_DATA_BYTES", str(sum(sizes) - 1))  # every part alone is under it
    with pytest.raises(DataError, match=r"3 Parquet files of [\d,]+ bytes in all, over the limit"):
        read_long_table(str(tmp_path / "panel"), columns=COLUMNS, series_column="unique_id")


def test_parts_of_different_types_are_refused_naming_the_part(panel, tmp_path):
    paths = _write_parts(panel.frame, tmp_path / "panel")
    odd = pd.read_parquet(paths[2])
    odd["y"] = odd["y"].astype(str)
    odd.to_parquet(paths[2], index=False)
    with pytest.raises(DataError, match=r"part-00002\.parquet: columns .* differ from those of the first part "
                                        r"part-00000\.parquet"):
        read_long_table(str(tmp_path / "panel"), columns=COLUMNS, series_column="unique_id")


def test_a_folder_without_parquet_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.csv").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="no \\*.parquet files"):
        read_long_table(str(tmp_path / "empty"), columns=COLUMNS, series_column="unique_id")


@pytest.mark.slow
def test_an_s3_prefix_reads_as_the_folder_does(panel, tmp_path, s3_bucket, s3_env):
    import boto3

    folder = tmp_path / "panel"
    _write_parts(panel.frame, folder)
    client = boto3.client("s3", endpoint_url=s3_env)
    for path in folder.iterdir():
        client.put_object(Bucket=s3_bucket, Key=f"fleets/m3/{path.name}", Body=path.read_bytes())
    client.put_object(Bucket=s3_bucket, Key="fleets/m3-other/part-9.parquet", Body=b"not this prefix")
    local = read_long_table(str(folder), columns=COLUMNS, series_column="unique_id")
    remote = read_long_table(f"s3://{s3_bucket}/fleets/m3/", columns=COLUMNS, series_column="unique_id")
    assert remote.sha256 == local.sha256 and remote.n_bytes == local.n_bytes
    pd.testing.assert_frame_equal(remote.frame, local.frame)


# --- bounded reading (issue 30, items 5, 6, 8): counted from the footer, ids by one rule ----

def _fleet(tmp_path, ids, name="fleet.parquet", **columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(ids)
    table = {"unique_id": ids, "ds": columns.pop("ds", pa.array(np.full(n, "2000-01-01", dtype=object))),
             "y": columns.pop("y", pa.array(np.ones(n)))}
    pq.write_table(pa.table(table), tmp_path / name)
    return str(tmp_path / name)


def test_whole_number_ids_are_read_as_text(tmp_path):
    import pyarrow as pa

    path = _fleet(tmp_path, pa.array(np.repeat(np.arange(20, dtype=np.int64), 3)))
    ids = read_long_table(path, columns=COLUMNS, series_column="unique_id").frame["unique_id"]
    assert ids.dtype.name == "category" and sorted(ids.cat.categories, key=int) == [str(i) for i in range(20)]


def test_text_repeated_on_every_row_is_counted_as_decoded(tmp_path, monkeypatch):
    """A 1 KB value on 3,000 rows is 3 MB decoded from a few KB of dictionary-encoded Parquet:
    read as a dictionary, its decoded size is counted before a row is materialised."""
    import pyarrow as pa

    from onnxcast.pipeline import reading

    path = _fleet(tmp_path, pa.array(["a"] * 3000), ds=pa.array(["2000-01-01" + " " * 1000] * 3000))
    monkeypatch.setattr(reading, "MAX_TABLE_BYTES", 1_000_000)
    with pytest.raises(DataError, match=r"text columns decode to more than 1,000,000 bytes \(column 'ds'"):
        read_long_table(path, columns=COLUMNS, series_column="unique_id")


def test_list_values_count_as_cells(tmp_path, monkeypatch):
    """Ten rows whose `y` holds 500 values each: 5,000 cells, whatever the row count says."""
    import pyarrow as pa

    path = _fleet(tmp_path, pa.array([f"s{i}" for i in range(10)]), y=pa.array([[1.0] * 500] * 10))
    monkeypatch.setenv("ONNXCAST_MAX_DATA_CELLS", "2000")
    with pytest.raises(DataError, match=r"Parquet file of 5,0\d\d cells \(by its metadata"):
        read_long_table(path, columns=COLUMNS, series_column="unique_id")


def test_the_first_bad_id_is_named_clipped_with_its_row_and_the_count(tmp_path):
    import pyarrow as pa

    ids = ["ok"] * 4 + ["B" * 5000] * 2 + ["C" * 300] * 2
    path = _fleet(tmp_path, pa.array(ids))
    with pytest.raises(DataError) as caught:
        read_long_table(path, columns=COLUMNS, series_column="unique_id")
    message = str(caught.value)
    assert "value 'BBBB" in message and "at row 5 is 5,000 characters long, more than 100" in message
    assert "(2 such ids)" in message and len(message) < 300
