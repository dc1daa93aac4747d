"""`onnxcast pipeline --data X` where X is not a data file: a device, a FIFO, a file over the
size limit, a secret file passed by mistake; and `--out` folders a killed or a concurrent run
is using. Each through the installed console script, under a timeout: /dev/zero once grew the
process to 21.7 GB and a FIFO blocked forever."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = str(Path(sys.executable).with_name("onnxcast"))
# Every refusal here comes before training; the settings keep a mistake from running long.
FAST = ["--models", "dlinear", "--max-epochs", "1", "--latency-repeats", "1"]
SHADOW = "root:*:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\nbin:*:20228:0:99999:7:::\n"
AWS_SECRET = "abc123SECRETdef456ghi789jkl012mno345pqr678"
AWS = f"AWS_ACCESS_KEY_ID=AKIAEXAMPLE\nAWS_SECRET_ACCESS_KEY={AWS_SECRET}\n"


def pipeline(data: str | Path, out: Path, *extra: str, timeout: float = 120, env: dict | None = None):
    started = time.monotonic()
    result = subprocess.run([SCRIPT, "pipeline", "--data", str(data), "--out", str(out), *FAST, *extra],
                            capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    return result, time.monotonic() - started


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()} \
        if folder.exists() else {}


class TestNotARegularFile:
    def test_dev_zero_is_refused_at_once_in_one_line(self, tmp_path):
        result, seconds = pipeline("/dev/zero", tmp_path / "out", timeout=60)
        assert result.returncode == 2, result.stderr[-2000:]
        assert error_lines(result.stderr) == [
            "error: /dev/zero: is a character device, not a regular file; expected a CSV or Parquet file"]
        assert "Traceback" not in result.stderr
        assert seconds < 30  # the refusal reads nothing: the time is the interpreter's start
        assert not files_under(tmp_path / "out")

    def test_a_fifo_is_refused_without_blocking(self, tmp_path):
        fifo = tmp_path / "data.csv"
        os.mkfifo(fifo)  # nobody ever writes to it: opening it for reading would block forever
        result, _ = pipeline(fifo, tmp_path / "out", timeout=60)
        assert result.returncode == 2, result.stderr[-2000:]
        assert error_lines(result.stderr) == [
            f"error: {fifo}: is a FIFO (named pipe), not a regular file; expected a CSV or Parquet file"]

    def test_a_file_over_the_size_limit_is_refused_before_it_is_read(self, tmp_path):
        big = tmp_path / "big.csv"
        with big.open("wb") as stream:  # sparse: 3 GiB long, no disk used
            stream.truncate(3 * 1024**3)
        result, seconds = pipeline(big, tmp_path / "out", timeout=60)
        assert result.returncode == 2, result.stderr[-2000:]
        assert error_lines(result.stderr) == [
            f"error: {big}: is 3,221,225,472 bytes, over the limit of 2,147,483,648 bytes for a data file "
            "(set ONNXCAST_MAX_DATA_BYTES to read larger files)"]
        assert seconds < 30

    def test_the_limit_is_a_setting(self, example_csv, tmp_path):
        result, _ = pipeline(example_csv, tmp_path / "out", env={"ONNXCAST_MAX_DATA_BYTES": "1000"})
        assert result.returncode == 2, result.stderr[-2000:]
        size = Path(example_csv).stat().st_size
        assert error_lines(result.stderr) == [
            f"error: {example_csv}: is {size:,} bytes, over the limit of 1,000 bytes for a data file "
            "(set ONNXCAST_MAX_DATA_BYTES to read larger files)"]


class TestSecretFilesAreNotEchoed:
    """A secret file given as --data by mistake: refused, and not a byte of it in the error, the
    GX report or validation_result.json (the first release quoted /etc/shadow's first line in all three)."""

    @pytest.mark.parametrize(("name", "content", "secrets"), [
        ("shadow", SHADOW, ["root:*", "20228", "99999", "daemon"]),
        ("aws.env", AWS, ["AKIAEXAMPLE", AWS_SECRET, "AWS_SECRET_ACCESS_KEY"]),
        ("file-url-shadow", SHADOW, ["root:*", "20228"]),
    ])
    def test_a_file_that_is_not_a_table_is_refused_without_quoting_it(self, tmp_path, name, content, secrets):
        path = tmp_path / name
        path.write_text(content)
        data = f"file://{path}" if name.startswith("file-url") else str(path)
        result, _ = pipeline(data, tmp_path / "out")
        assert result.returncode == 2, result.stderr[-2000:]
        lines = error_lines(result.stderr)
        assert lines == [f"error: {data}: not a table: the first line has no ',' between fields and is not a "
                         "column name (expected a header such as 'ds,y', then one row per timestamp)"]
        for secret in secrets:
            assert secret not in result.stderr
        assert not files_under(tmp_path / "out")  # refused before the checks: no report at all

    def test_a_lone_token_reaches_neither_the_message_nor_the_reports(self, tmp_path):
        """One word per line looks like a one-column table: the checks run and write their
        reports, and the word (a token here) is in none of them."""
        token = "ghp_16C7e42F292c6912E7710c838347Ae178B4a"
        path = tmp_path / "token.txt"
        path.write_text(f"{token}\nsecond\n")
        result, _ = pipeline(path, tmp_path / "out")
        assert result.returncode == 2, result.stderr[-2000:]
        assert "missing ['ds', 'y']" in result.stderr
        reports = files_under(tmp_path / "out")
        assert {"quality/quality_report.html", "quality/validation_result.json"} <= set(reports)
        for secret in (token, "ghp_16C7e42F"):
            assert secret not in result.stderr
            assert all(secret.encode() not in data for data in reports.values()), secret

    def test_a_first_line_of_data_is_not_quoted(self, example_csv, tmp_path):
        path = tmp_path / "no-header.csv"
        path.write_bytes(Path(example_csv).read_bytes().split(b"\n", 1)[1])  # starts "2012-01-01 00:00:00,7926.529376"
        result, _ = pipeline(path, tmp_path / "out")
        assert result.returncode == 2, result.stderr[-2000:]
        assert ("required columns ['ds', 'y'] present: missing ['ds', 'y']; the first line is not a header of "
                "column names (2 field(s) that look like data or other text, not shown)") in result.stderr
        reports = files_under(tmp_path / "out")
        for value in (b"7926.529376", b"2012-01-01 00:00:00"):
            assert value.decode() not in result.stderr
            assert all(value not in data for data in reports.values()), value

    def test_column_names_of_a_real_table_are_still_named(self, example_csv, tmp_path):
        path = tmp_path / "renamed.csv"
        path.write_bytes(Path(example_csv).read_bytes().replace(b"ds,y", b"timestamp,load", 1))
        result, _ = pipeline(path, tmp_path / "out")
        assert result.returncode == 2, result.stderr[-2000:]
        assert "missing ['ds', 'y']; found ['load', 'timestamp']" in result.stderr  # GX lists them sorted


class TestStagingFolder:
    def test_a_run_killed_mid_way_leaves_a_staging_folder_the_next_run_removes(self, example_csv, tmp_path):
        out = tmp_path / "out"
        process = subprocess.Popen([SCRIPT, "pipeline", "--data", example_csv, "--out", str(out), *FAST],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            deadline = time.monotonic() + 60
            while not (out / ".staging").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (out / ".staging").exists()
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
        assert (out / ".staging").is_dir()  # SIGKILL: no cleanup ran
        result, _ = pipeline("/dev/zero", out, timeout=60)  # the next run fails early, and still cleans
        assert result.returncode == 2
        assert not os.path.lexists(out / ".staging")
        assert "removed" in result.stderr and ".staging left by an interrupted run" in result.stderr

    def test_a_stale_staging_symlink_is_refused_neither_followed_nor_removed(self, tmp_path):
        """No onnxcast run records a link as its staging folder: the first release unlinked it,
        now the run is refused and the link stays (tests/cli/test_output_ownership.py)."""
        out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "precious.txt").write_text("keep me")
        out.mkdir()
        (out / ".staging").symlink_to(elsewhere, target_is_directory=True)
        result, _ = pipeline("/dev/zero", out, timeout=60)
        assert result.returncode == 2, result.stderr[-2000:]
        assert error_lines(result.stderr) == [
            f"error: --out {out}: {out / '.staging'} is a symbolic link, which onnxcast never writes nor follows; "
            "a run replaces only onnxcast's own earlier output: move it away or choose another --out"]
        assert (out / ".staging").is_symlink()
        assert (elsewhere / "precious.txt").read_text() == "keep me"

    def test_a_second_run_on_the_same_folder_is_refused_and_leaves_the_first_alone(self, tmp_path):
        """The first release's second run deleted the first one's staging folder under it."""
        out = tmp_path / "out"
        holder = subprocess.Popen(  # another run: holds the folder's lock and has staged a file
            [sys.executable, "-c",
             "import sys, time; from pathlib import Path; from onnxcast.pipeline.run import run_dir_lock\n"
             "out = Path(sys.argv[1])\n"
             "with run_dir_lock(out):\n"
             "    (out / '.staging').mkdir(); (out / '.staging' / 'model.pt').write_text('half-trained')\n"
             "    print('ready', flush=True); time.sleep(120)\n", str(out)],
            stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "ready"
            result, _ = pipeline("/dev/zero", out, timeout=60)
            assert result.returncode == 1, result.stderr[-2000:]
            assert error_lines(result.stderr) == [
                f"error: {out}: another onnxcast pipeline run is writing to this folder; wait for it to finish "
                "or choose another --out"]
            assert (out / ".staging" / "model.pt").read_text() == "half-trained"
        finally:
            holder.kill()
            holder.wait(timeout=30)
