"""The device command (``onnxcast-edge``): inputs bounded however they are read, forecast
times at the calendar's edges, hints that name the running command's real options, and the
watch interval. Through the console scripts and ``onnxcast.cli.main``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rollout_support import one_error_line

from onnxcast import cli
from onnxcast.rollout.edge import pull
from onnxcast.rollout.promote import promote
from onnxcast.rollout.signing import generate_key

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def edge_pull(store: str, dest, *extra: str) -> int:
    return cli.main(["edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", str(dest),
                     *extra])



# --- device inputs bounded however they are read ---------------------------------

def console(program: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A console script in a child process with a 2 GiB address-space cap (an unbounded read
    becomes a MemoryError, not a swapped machine) and a timeout (a hang becomes a failure)."""
    import resource

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([str(BIN / program), *argv], capture_output=True, text=True, timeout=timeout, env=env,
                          preexec_fn=cap_memory)


@pytest.fixture
def device(tmp_path, make_run):
    store, dest = str(tmp_path / "store"), tmp_path / "device"
    promote(make_run("a"), store, "m", "edge", version="1")
    pull(store, "m", "edge", dest)
    return dest


def history_csv(path: Path, rows: int = 20, last: str | None = None, hourly: bool = True) -> Path:
    lines = ["ds,y,x1"]
    for i in range(rows):
        ds = f"2026-01-01T{i:02d}:00:00Z" if hourly else f"2026-01-{i + 1:02d}"
        lines.append(f"{ds},{100 + i},{i % 5}")
    if last is not None:
        lines[-1] = f"{last},{100 + rows},1"
    path.write_text("\n".join(lines) + "\n")
    return path


class TestBoundedInput:
    def test_one_long_line_of_commas_is_refused_without_holding_it(self, device, tmp_path, capsys):
        import tracemalloc

        commas = tmp_path / "commas.csv"
        commas.write_bytes(b"ds,y,x1\n" + b"," * (24 << 20) + b"\n")
        tracemalloc.start()
        try:
            code = cli.main(["edge", "predict", "--dir", str(device), "--input", str(commas)])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert code == 2
        one_error_line(capsys, "commas.csv': a line longer than 1,048,576 bytes; expected a CSV table")
        assert peak < 16 << 20, peak  # the old reader held all 25 million fields (3.4 GB for 200 MB)

    def test_rows_too_wide_are_refused_and_only_used_cells_are_kept(self, device, tmp_path, capsys):
        wide = tmp_path / "wide.csv"
        history_csv(wide)
        with wide.open("a") as f:
            f.write("2026-01-02T00:00:00Z,1,1" + "," * 20_000 + "\n")
        assert cli.main(["edge", "predict", "--dir", str(device), "--input", str(wide)]) == 2
        one_error_line(capsys, "wide.csv: line 22 has 20,003 fields, more than 10,000; expected a CSV table")

    def test_proc_pagemap_says_zero_bytes_and_is_still_bounded(self, device):
        done = console("onnxcast", "edge", "predict", "--dir", str(device), "--input", "/proc/self/pagemap",
                       timeout=60)
        assert done.returncode == 2, done.stderr[-2000:]
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.startswith("error: input '/proc/self/pagemap': ")

    def test_proc_mem_read_error_is_one_line(self, device):
        done = console("onnxcast", "edge", "predict", "--dir", str(device), "--input", "/proc/self/mem", timeout=60)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr == "error: input '/proc/self/mem': cannot read (Input/output error)\n"

    @pytest.mark.parametrize("argv, message", [
        (["edge", "pull", "--store", "S", "--model", "m", "--channel", "edge", "--dest", "D",
          "--trust", "/proc/self/pagemap"], "error: trust root '/proc/self/pagemap' cannot be read: "),
        (["refresh", "--store", "S", "--model", "m", "--channel", "edge", "--signing-key", "/proc/self/mem"],
         "error: signing key '/proc/self/mem' cannot be read: Input/output error; cannot read the signing key\n"),
        (["edge", "trust", "--dest", "D", "--root", "/proc/self/mem"],
         "error: trust root '/proc/self/mem' cannot be read: Input/output error; cannot read the trust root\n"),
    ])
    def test_keys_and_roots_from_proc_are_one_line(self, tmp_path, argv, message):
        argv = [str(tmp_path / a) if a in ("S", "D") else a for a in argv]
        done = console("onnxcast", *argv, timeout=60)
        assert done.returncode == 2 and done.stderr.startswith(message), done.stderr[-2000:]
        assert len(done.stderr.splitlines()) == 1


# --- forecast times -------------------------------------------------------------

class TestForecastTimes:
    def test_the_last_representable_hour_leaves_times_empty_with_one_warning(self, device, tmp_path, capsys,
                                                                            caplog):
        data = history_csv(tmp_path / "late.csv", last="9999-12-31T23:00:00Z")
        assert cli.main(["edge", "predict", "--dir", str(device), "--input", str(data)]) == 0
        rows = [line.split(",") for line in capsys.readouterr().out.splitlines()]
        assert [r[1] for r in rows[1:]] == ["", "", "", ""]
        warnings = [r for r in caplog.records if "forecast times left empty" in r.getMessage()]
        assert len(warnings) == 1

    def test_a_date_on_an_hourly_model_prints_full_timestamps(self, device, tmp_path, capsys):
        data = history_csv(tmp_path / "dates.csv", hourly=False)
        assert cli.main(["edge", "predict", "--dir", str(device), "--input", str(data)]) == 0
        rows = [line.split(",") for line in capsys.readouterr().out.splitlines()]
        assert [r[1] for r in rows[1:]] == [f"2026-01-20T0{h}:00:00" for h in (1, 2, 3, 4)]

    @pytest.mark.parametrize("last, freq, expected", [
        ("2026-01-15", "ME", ["2026-01-31", "2026-02-28", "2026-03-31"]),
        ("2026-01-31", "ME", ["2026-02-28", "2026-03-31", "2026-04-30"]),
        ("2026-01-15", "QE", ["2026-03-31", "2026-06-30", "2026-09-30"]),
        ("2026-02-15", "QS", ["2026-04-01", "2026-07-01", "2026-10-01"]),
        ("2026-03-15", "YS", ["2027-01-01", "2028-01-01", "2029-01-01"]),
        ("2026-03-15", "YE", ["2026-12-31", "2027-12-31", "2028-12-31"]),
        ("2026-01-15", "QE-MAR", ["2026-03-31", "2026-06-30", "2026-09-30"]),
        ("2026-01-05", "W-SUN", ["2026-01-11", "2026-01-18", "2026-01-25"]),
        ("2026-01-05", "W-WED", ["2026-01-07", "2026-01-14", "2026-01-21"]),
        ("2026-01-05", "W", ["2026-01-11", "2026-01-18", "2026-01-25"]),
        ("2026-01-15", "2ME", ["2026-02-28", "2026-04-30", "2026-06-30"]),
        ("2026-01-15T10:00:00Z", "ME", ["2026-01-31T10:00:00Z", "2026-02-28T10:00:00Z", "2026-03-31T10:00:00Z"]),
        ("2026-01-01", "6h", ["2026-01-01T06:00:00", "2026-01-01T12:00:00", "2026-01-01T18:00:00"]),
        ("9999-12-31T23:00:00Z", "h", None),
        ("2026-01-01", "h-MON", None),
    ])
    def test_steps_are_those_of_pandas_offsets(self, last, freq, expected):
        from onnxcast.rollout.edge import future_times

        assert future_times(last, freq, 3) == expected


# --- hints name the running command and its real options --------------------------

class TestHints:
    def test_keys_root_without_a_key_names_sign_with(self, tmp_path):
        key = generate_key(tmp_path / "k")
        done = console("onnxcast-edge", "keys", "root", "--out", str(tmp_path / "r.json"),
                       "--root-key", str(key["public"]), "--release-key", str(key["public"]), "--sign-with", "")
        assert done.returncode == 2
        assert done.stderr == "error: no signing key: pass --sign-with (a key file from 'onnxcast-edge keys generate " \
                              "--out DIR', or awskms:<key id>)\n"

    def test_device_help_names_the_device_command(self):
        done = console("onnxcast-edge", "trust", "--help")
        text = " ".join(done.stdout.split())
        assert "root.json from 'onnxcast-edge keys generate' or 'onnxcast-edge keys root'" in text, text
        done = console("onnxcast-edge", "keys", "publish-root", "--help")
        assert "root file from 'onnxcast-edge keys root'" in " ".join(done.stdout.split())

    def test_full_install_help_names_onnxcast_keys(self, capsys):
        with pytest.raises(SystemExit):
            cli.main(["edge", "trust", "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "root.json from 'onnxcast keys generate' or 'onnxcast keys root'" in text, text


# --- the watch interval -----------------------------------------------------------

class TestWatchInterval:
    @pytest.mark.parametrize("value", ["nan", "inf", "1e308", "-1", "86401"])
    def test_a_bad_interval_is_refused_before_the_first_poll(self, device, tmp_path, value, capsys):
        store = str(tmp_path / "store")
        assert edge_pull(store, device, "--watch", "--interval", value, "--max-polls", "2") == 2
        captured = capsys.readouterr()
        assert captured.out == ""  # no poll ran
        one_error_line(type("C", (), {"readouterr": lambda self: captured})(),
                       "--interval must be between 0 and 86,400 seconds (a day), got ")

    def test_a_day_and_zero_are_accepted(self, device, tmp_path, capsys):
        store = str(tmp_path / "store")
        assert edge_pull(store, device, "--watch", "--interval", "0", "--max-polls", "2") == 0
        assert capsys.readouterr().out.count("unchanged at version 1") == 2
        assert edge_pull(store, device, "--watch", "--interval", "86400", "--max-polls", "1") == 0
