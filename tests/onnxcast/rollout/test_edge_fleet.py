"""`onnxcast edge predict --series-column`: a long table of many real series (M3 monthly)
in, one forecast block per series out, equal to a direct ONNX Runtime run of the same
(newest, edge-padded) histories; short series padded and named; bad rows refused in one
line naming the series, the line and the value.

The model is the session's tiny untrained LSTM made for the panel (target ``y`` only,
lookback 24, horizon 18, season 12, monthly): ``tiny_onnx`` is overridden here, so the
shared ``make_run`` fixture promotes it as it promotes the usual one.
"""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from onnxcast import cli
from onnxcast.rollout.cli import edge_main
from onnxcast.rollout.edge import future_times, predict, pull
from onnxcast.rollout.promote import promote

LOOKBACK, HORIZON, SEASON = 24, 18, 12
N_SERIES = 300
PADDED = 3  # series cut to 15 rows: above the season (12), below the lookback (24)


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory):
    """An untrained global-style LSTM for a monthly panel: one column (y), lookback 24,
    horizon 18, with the fleet metadata keys a global export adds."""
    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.models import ModelSpec, build_model

    spec = ModelSpec(family="lstm", n_features=1, horizon=HORIZON, lookback=LOOKBACK, hidden_size=8, num_layers=1,
                     season=SEASON)
    model = build_model(spec, np.array([0.0]), np.array([1.0]))
    metadata = {"model_family": "lstm", "lookback": LOOKBACK, "horizon": HORIZON, "freq": "MS", "target": "y",
                "features": "", "precision": "fp32", "trained_until": "2000-01-01T00:00:00Z",
                "dataset_sha256": "ab" * 32, "season": SEASON, "global": "true", "n_series": N_SERIES,
                "series_column": "unique_id"}
    path = tmp_path_factory.mktemp("fleet-onnx") / "lstm-fp32.onnx"
    return export_onnx(model, path, n_features=1, lookback=LOOKBACK, metadata=metadata)


@pytest.fixture(scope="module")
def panel_frame():
    """300 M3 monthly series (ids, ISO dates, y), the first PADDED cut to their last 15 rows."""
    from tests.real_panels import load_panel

    frame = load_panel("m3-monthly", limit=N_SERIES).frame
    ids = list(dict.fromkeys(frame["unique_id"]))
    short = frame["unique_id"].isin(ids[:PADDED])
    newest = frame.groupby("unique_id").cumcount(ascending=False) < 15
    return frame[~short | newest].reset_index(drop=True), ids


@pytest.fixture
def device(tmp_path, make_run):
    store, dest = str(tmp_path / "store"), tmp_path / "device"
    report = make_run("a")
    promote(report, store, "m", "edge")
    pull(store, "m", "edge", dest)
    return dest, report.parent / "models/lstm/onnx/fp32-opt.onnx"


def _write(frame, path, *, shuffle: bool = True, extra: bool = True):
    """The long table as CSV, rows in a seeded random order (a fleet export need not be
    sorted), with a column the model does not read."""
    if shuffle:
        frame = frame.sample(frac=1.0, random_state=0)
    if extra:
        frame = frame.assign(region="north")
    frame.to_csv(path, index=False)
    return path


def _expected(frame, onnx_path):
    """What a user computes by hand: each series ordered by time, its newest LOOKBACK values,
    edge-padded with its first value, one ORT run of the whole batch."""
    from onnxcast.pipeline.sessions import onnx_predict, onnx_session

    ids, histories, last = [], [], []
    for series, part in frame.groupby("unique_id", sort=False):
        y = part.sort_values("ds")["y"].to_numpy(np.float32)[-LOOKBACK:]
        histories.append(np.concatenate([np.full(LOOKBACK - len(y), y[0], np.float32), y]))
        ids.append(series)
        last.append(part["ds"].max())
    forecast = onnx_predict(onnx_session(onnx_path), np.stack(histories)[:, :, None])
    return ids, forecast, last


class TestFleetPredict:
    def test_one_block_per_series_equal_to_a_direct_ort_run(self, device, panel_frame, tmp_path, capsys, caplog):
        dest, onnx_path = device
        frame, ids = panel_frame
        path = _write(frame, tmp_path / "fleet.csv")
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(path),
                         "--series-column", "unique_id"]) == 0
        captured = capsys.readouterr()
        rows = list(csv.reader(io.StringIO(captured.out)))
        assert rows[0] == ["unique_id", "step", "ds", "forecast", "version"]
        body = rows[1:]
        assert len(body) == N_SERIES * HORIZON
        want_ids, want, last = _expected(frame, onnx_path)
        printed_ids = [body[i][0] for i in range(0, len(body), HORIZON)]
        assert sorted(printed_ids) == sorted(ids)  # every series once, in one block
        order = {s: i for i, s in enumerate(want_ids)}
        got = np.array([[np.float32(r[3]) for r in body[i:i + HORIZON]] for i in range(0, len(body), HORIZON)])
        expected = want[[order[s] for s in printed_ids]]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())
        for k, series in enumerate(printed_ids):
            block = body[k * HORIZON:(k + 1) * HORIZON]
            assert [r[1] for r in block] == [str(s) for s in range(1, HORIZON + 1)]
            assert [r[2] for r in block] == future_times(last[order[series]], "MS", HORIZON)
        # one warning line per padded series, naming it
        padded = [r.getMessage() for r in caplog.records if "edge-padded" in r.getMessage()]
        assert len(padded) == PADDED
        for series in ids[:PADDED]:
            assert sum(repr(series) in line and "15 row(s)" in line for line in padded) == 1

    def test_chunks_and_row_order_do_not_change_the_forecast(self, device, panel_frame, tmp_path):
        dest, _ = device
        frame, _ = panel_frame
        sorted_path = _write(frame, tmp_path / "sorted.csv", shuffle=False, extra=False)
        shuffled_path = _write(frame, tmp_path / "shuffled.csv")
        a = predict(dest, sorted_path, series_column="unique_id", out=io.StringIO())
        b = predict(dest, shuffled_path, series_column="unique_id", out=io.StringIO(), chunk=7)
        assert a.padded == list(dict.fromkeys(frame["unique_id"]))[:PADDED]
        by_id = dict(zip(b.series, b.forecast, strict=True))
        np.testing.assert_allclose(a.forecast, np.stack([by_id[s] for s in a.series]), rtol=1e-6, atol=1e-3)

    def test_device_command_takes_the_same_option(self, device, panel_frame, tmp_path, capsys):
        dest, _ = device
        frame, ids = panel_frame
        path = _write(frame[frame["unique_id"].isin(ids[:20])], tmp_path / "few.csv")
        assert edge_main(["predict", "--dir", str(dest), "--input", str(path), "--series-column", "unique_id"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == "unique_id,step,ds,forecast,version" and len(out) == 1 + 20 * HORIZON

    def test_without_series_column_an_id_column_changes_nothing(self, device, panel_frame, tmp_path, capsys):
        dest, _ = device
        frame, ids = panel_frame
        one = frame[frame["unique_id"] == ids[-1]]
        _write(one, tmp_path / "with-id.csv", shuffle=False, extra=False)
        _write(one.drop(columns="unique_id"), tmp_path / "plain.csv", shuffle=False, extra=False)
        outputs = []
        for name in ("with-id.csv", "plain.csv"):
            assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(tmp_path / name)]) == 0
            outputs.append(capsys.readouterr().out)
        assert outputs[0] == outputs[1] and outputs[0].startswith("step,ds,forecast,version\n")
        assert len(outputs[0].splitlines()) == 1 + HORIZON

    def test_series_below_the_minimum_is_refused_by_name(self, device, panel_frame, tmp_path, capsys, caplog):
        dest, _ = device
        frame, ids = panel_frame
        keep = frame["unique_id"].isin(ids[:10])
        cut = (frame["unique_id"] == ids[5]) & (frame.groupby("unique_id").cumcount(ascending=False) >= 4)
        path = _write(frame[keep & ~cut], tmp_path / "short.csv")
        argv = ["edge", "predict", "--dir", str(dest), "--input", str(path), "--series-column", "unique_id"]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("error: ")
        assert f"{ids[5]!r} (4)" in err[0] and "fewer than the 12 row(s)" in err[0]
        assert cli.main([*argv, "--min-rows", "4"]) == 0  # asked for: padded, and named
        assert any(f"series {ids[5]!r} has 4 row(s), edge-padded" in r.getMessage() for r in caplog.records)

    @pytest.mark.parametrize("change, message", [
        (lambda lines: lines.__setitem__(3, "," + lines[3].split(",", 1)[1]),
         r"unique_id value '' at line 4 is empty; expected a series id$"),
        (lambda lines: lines.append(lines[2]),
         r"series '(\w+)': duplicate ds '[\d-]+' at lines 3 and (\d+)$"),
        (lambda lines: lines.__setitem__(5, lines[5].rsplit(",", 1)[0] + ",12.5kW"),
         r"series '(\w+)': column 'y' has non-numeric value '12.5kW' at line 6$"),
        (lambda lines: lines.__setitem__(5, lines[5].rsplit(",", 1)[0] + ",inf"),
         r"series '(\w+)': column 'y' value 'inf' at line 6 is not finite$"),
        (lambda lines: lines.__setitem__(7, lines[7].split(",")[0] + ",last tuesday," + lines[7].split(",")[2]),
         r"series '(\w+)': ds value 'last tuesday' at line 8 is not an ISO 8601 time or a number$"),
        (lambda lines: lines.__setitem__(0, "id,ds,y"),
         r"missing column\(s\) 'unique_id'; found 'id', 'ds', 'y'$"),
    ])
    def test_bad_rows_one_line_naming_series_line_and_value(self, device, panel_frame, tmp_path, capsys, change,
                                                            message):
        import re

        dest, _ = device
        frame, ids = panel_frame
        lines = frame[frame["unique_id"].isin(ids[:5])].to_csv(index=False).splitlines()
        change(lines)
        (tmp_path / "bad.csv").write_text("\n".join(lines) + "\n")
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(tmp_path / "bad.csv"),
                         "--series-column", "unique_id"]) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        err = captured.err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'bad.csv'}: ")
        assert re.search(message, err[0]), err[0]

    def test_the_device_refuses_the_ids_the_pipeline_refuses_in_the_same_words(self, device, panel_frame,
                                                                              tmp_path, capsys):
        """One rule (onnxcast.base.untrusted.series_id_problem) for `onnxcast pipeline` and the device."""
        from onnxcast.base.untrusted import series_id_problem

        dest, _ = device
        frame, ids = panel_frame
        for bad in ("s\u202eevil", "s\x07bell", "x" * 101, "tab\there"):
            five = frame[frame["unique_id"].isin(ids[:5])].replace({"unique_id": {ids[4]: bad}})
            path = _write(five, tmp_path / "ids.csv", shuffle=False)
            assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(path),
                             "--series-column", "unique_id"]) == 2
            err = capsys.readouterr().err.splitlines()
            assert len(err) == 1 and f"is {series_id_problem(bad)}; expected a series id" in err[0], err

    def test_input_limits_still_hold(self, device, tmp_path, capsys):
        dest, _ = device
        (tmp_path / "wide.csv").write_text("unique_id,ds,y\n" + ",".join(["1"] * 10_001) + "\n")
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(tmp_path / "wide.csv"),
                         "--series-column", "unique_id"]) == 2
        assert "line 2 has 10,001 fields, more than 10,000" in capsys.readouterr().err
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", "/dev/zero",
                         "--series-column", "unique_id"]) == 2
        assert len(capsys.readouterr().err.splitlines()) == 1


@pytest.mark.parametrize("extra, message", [
    (["--min-rows", "4"], "error: --min-rows applies to a fleet input: add --series-column"),
    (["--series-column", "ds"], "error: --series-column and --time-column are both 'ds'; a fleet table needs one "
                                "column of each"),
    (["--series-column", "unique_id", "--min-rows", "25"],
     "error: min_rows must be between 1 and the model's lookback of 24, got 25"),
])
def test_bad_options_one_line(device, panel_frame, tmp_path, capsys, extra, message):
    dest, _ = device
    frame, ids = panel_frame
    path = _write(frame[frame["unique_id"].isin(ids[:3])], tmp_path / "few.csv")
    assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(path), *extra]) == 2
    assert capsys.readouterr().err.splitlines() == [message]


def test_device_process_without_pandas_prints_one_warning_line_per_padded_series(device, panel_frame, tmp_path):
    """The device command in its own process, torch and pandas blocked as on a device: the
    forecasts on stdout, each padded series named on its own stderr line."""
    import subprocess
    import sys

    dest, _ = device
    frame, ids = panel_frame
    path = _write(frame[frame["unique_id"].isin(ids[:10])], tmp_path / "ten.csv")
    heavy = ("torch", "pandas", "mlflow", "onnx", "airflow", "great_expectations")
    code = (f"import sys\nfor name in {heavy!r}:\n    sys.modules[name] = None\n"
            "from onnxcast.rollout.cli import edge_main\n"
            f"code = edge_main(['predict', '--dir', {str(dest)!r}, '--input', {str(path)!r}, "
            "'--series-column', 'unique_id'])\n"
            f"assert not [m for m in {heavy!r} if sys.modules.get(m) is not None]\nsys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1 + 10 * HORIZON
    warnings = result.stderr.splitlines()
    assert len(warnings) == PADDED, result.stderr
    for series in ids[:PADDED]:
        assert sum(f"series {series!r} has 15 row(s), edge-padded to the model's lookback of 24" in line
                   for line in warnings) == 1


class TestSpreadsheetSafeOutput:
    """Series ids (and column names) are the input's text: printed as CSV that a spreadsheet
    opens, one starting with ``=``, ``+``, ``-`` or ``@`` would run as a formula (issue 30,
    item 11). Such a text cell gets a leading ``'``; numbers, negative forecasts included, stay
    numbers."""

    HOSTILE = ["=cmd|' /C calc'!A0", "@SUM(1+1)*cmd|' /C calc'!A0", "+1+cmd|' /C calc'!A0", "-2+3+cmd|'/C calc'!A0",
               "=HYPERLINK(\"http://evil.example\",\"x\")"]
    PLAIN = ["-7", "meter 1"]  # a plain number is no formula; ordinary text is unchanged

    def _table(self, path, series_column: str = "unique_id"):
        lines = [f"{series_column},ds,y"]
        for k, series in enumerate(self.HOSTILE + self.PLAIN):
            quoted = '"' + series.replace('"', '""') + '"'
            lines += [f"{quoted},{2000 + m // 12}-{m % 12 + 1:02d}-01,{-100.0 - k - (m % 12)}" for m in range(LOOKBACK)]
        path.write_text("\n".join(lines) + "\n")
        return path

    @pytest.mark.parametrize("command", ["onnxcast", "onnxcast-edge"])
    def test_formula_ids_are_text_and_forecasts_numbers(self, device, tmp_path, capsys, command):
        dest, _ = device
        path = self._table(tmp_path / "hostile.csv", "-id")
        argv = ["predict", "--dir", str(dest), "--input", str(path), "--series-column=-id"]
        assert (cli.main(["edge", *argv]) if command == "onnxcast" else edge_main(argv)) == 0
        rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
        assert rows[0] == ["'-id", "step", "ds", "forecast", "version"]
        printed = [rows[i][0] for i in range(1, len(rows), HORIZON)]
        assert printed == ["'" + s for s in self.HOSTILE] + self.PLAIN
        for row in rows[1:]:
            assert not row[0].startswith(("=", "+", "@", "\t", "\r")) and (row[0] == "-7" or row[0][0] != "-")
            assert float(row[3]) < 0 and row[3].startswith("-")  # negative forecasts: numbers, no quote
            assert not row[2].startswith("'") and not row[4].startswith("'")

    def test_single_series_column_names_are_text_cells_too(self, device, tmp_path, capsys):
        dest, _ = device
        lines = ["=ds,y"] + [f"{2000 + m // 12}-{m % 12 + 1:02d}-01,{-5.0 - m % 12}" for m in range(LOOKBACK)]
        (tmp_path / "one.csv").write_text("\n".join(lines) + "\n")
        assert cli.main(["edge", "predict", "--dir", str(dest), "--input", str(tmp_path / "one.csv"),
                         "--time-column", "=ds"]) == 0
        rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
        assert rows[0] == ["step", "'=ds", "forecast", "version"]
        assert len(rows) == 1 + HORIZON and all(float(r[2]) < 0 for r in rows[1:])
        assert rows[1][1] == "2002-01-01"  # times are no text cells to neutralize
