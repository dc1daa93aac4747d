"""Reading files that are not what they claim: refused in one line naming the file, or decoded on purpose."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
from pathlib import Path

import pytest
from corpus.bad_inputs import BAD_INPUTS, parquet

from onnxcast.base.errors import DataError
from onnxcast.pipeline.reading import MAX_FIELD_CHARS, parse_table, read_table

READING_CASES = [c for c in BAD_INPUTS if c.stage == "reading"]


@pytest.fixture(scope="module")
def base(example_csv) -> bytes:
    return Path(example_csv).read_bytes()


@pytest.mark.parametrize("case", READING_CASES, ids=[c.name for c in READING_CASES])
def test_bad_file_is_refused_in_one_line_naming_the_file(case, base, tmp_path):
    path = case.write(tmp_path, base)
    with pytest.raises(DataError) as error:
        read_table(str(path))
    message = str(error.value)
    assert case.expect in message
    assert message.startswith(str(path))
    assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress], ids=["gzip", "bzip2", "xz"])
def test_compressed_csv_is_read_by_content_whatever_the_name(compress, base, tmp_path):
    data = compress(base)
    path = tmp_path / "data.csv"  # no .gz: the magic bytes decide
    path.write_bytes(data)
    raw = read_table(str(path))
    assert raw.frame.shape == (3600, 2)
    assert raw.sha256 == hashlib.sha256(data).hexdigest()  # the hash is of the bytes as stored
    assert raw.n_bytes == len(data)


def test_parquet_and_gzipped_parquet(base):
    data = parquet(base)
    assert parse_table(data, "x.parquet").shape == (3600, 2)
    assert parse_table(gzip.compress(data), "x.parquet.gz").shape == (3600, 2)


@pytest.mark.parametrize("data", [
    b"\xef\xbb\xbf ds , y \n2012-01-01 00:00,1\n",  # UTF-8 BOM, padded names
    " ds , y \n2012-01-01 00:00,1\n".encode("utf-16"),  # Excel "Unicode text"
], ids=["utf8-bom", "utf16-bom"])
def test_text_encodings_with_a_bom_and_padded_header(data):
    frame = parse_table(data, "x.csv")
    assert list(frame.columns) == ["ds", "y"]
    assert frame["y"].tolist() == [1]


def test_not_utf8_names_the_byte_and_line():
    data = "ds,y\n2012-01-01 00:00,1\n2012-01-01 01:00,2 \xb0C\n".encode("latin-1")
    with pytest.raises(DataError, match=r"x.csv: not UTF-8: byte 0xb0 at offset \d+ \(line 3\)"):
        parse_table(data, "x.csv")


def test_field_limit_applies_to_any_column():
    data = b"ds,y,note\n2012-01-01,1," + b"n" * (MAX_FIELD_CHARS + 1) + b"\n"
    with pytest.raises(DataError, match="in column 'note' at row 1"):
        parse_table(data, "x.csv")


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        read_table(str(tmp_path))


def test_s3_object_over_the_size_limit_is_refused_before_it_is_read(s3_bucket, base, monkeypatch):
    import boto3

    boto3.client("s3").put_object(Bucket=s3_bucket, Key="in/big.csv", Body=base)
    monkeypatch.setenv("ONNXCAST_MAX_DATA_BYTES", str(len(base) - 1))
    with pytest.raises(DataError, match=rf"s3://{s3_bucket}/in/big.csv is {len(base):,} bytes, over the limit"):
        read_table(f"s3://{s3_bucket}/in/big.csv")
    monkeypatch.setenv("ONNXCAST_MAX_DATA_BYTES", str(len(base)))
    assert read_table(f"s3://{s3_bucket}/in/big.csv").n_bytes == len(base)


def test_s3_object_is_read_and_decompressed(s3_bucket, base):
    import boto3

    boto3.client("s3").put_object(Bucket=s3_bucket, Key="in/data.csv.gz", Body=gzip.compress(base))
    raw = read_table(f"s3://{s3_bucket}/in/data.csv.gz")
    assert raw.frame.shape == (3600, 2)
    with pytest.raises(DataError, match=rf"s3://{s3_bucket}/in/absent.csv: cannot read from S3 \(NoSuchKey\)"):
        read_table(f"s3://{s3_bucket}/in/absent.csv")


def test_a_parquet_file_with_the_timestamps_as_its_index_reads_them_as_a_column(tmp_path):
    import pandas as pd

    from onnxcast.pipeline.reading import read_table

    frame = pd.DataFrame({"y": [1.0, 2.0, 3.0]}, index=pd.date_range("2024-01-01", periods=3, freq="h", name="ds"))
    frame.to_parquet(tmp_path / "indexed.parquet")
    table = read_table(str(tmp_path / "indexed.parquet")).frame
    assert list(table.columns) == ["ds", "y"] and isinstance(table.index, pd.RangeIndex)
