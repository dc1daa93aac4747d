"""`onnxcast pipeline --out DIR` replaces only what an earlier onnxcast run wrote in DIR.

The first release, run with `--out .` in a project holding data/meters.csv and data/README.txt,
exited 0 with data/ holding only its own four files: the input and the notes were gone
(issue 30, item 1). Every layout here goes through `onnxcast.cli.main`, the console script's
function. A refusal comes before the data is read, so those cases cost no training; one test
trains twice (a first run, then a rerun over its output, which must work).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from onnxcast import cli

RECORD = ".onnxcast-output.json"  # the record of what onnxcast wrote in a folder (a name users see)

# dlinear for one epoch on weekly CO2 (tests/real_series.py) passes its gates; the tolerance
# keeps a one-epoch model's coverage out of the way (the coverage gate has its own tests)
FAST = ["--models", "dlinear", "--max-epochs", "1", "--horizon", "12", "--lookback", "56", "--latency-repeats", "3",
        "--coverage-tolerance", "0.2"]
NOTES = "how the meters were read: by hand, on Mondays\n"


def pipeline(data: str | Path, out: str | Path, capsys) -> tuple[int, list[str]]:
    """Run the command; its exit code and the `error:` lines it printed."""
    code = cli.main(["pipeline", "--data", str(data), "--out", str(out), *FAST])
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.startswith("error:")]


def snapshot(folder: Path) -> dict[str, bytes | str]:
    """Every path under ``folder`` (links as their target, never followed) and its bytes."""
    out: dict[str, bytes | str] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root) / name
            key = path.relative_to(folder).as_posix()
            out[key] = f"-> {os.readlink(path)}" if path.is_symlink() else (
                path.read_bytes() if path.is_file() else "dir")
    return out


@pytest.fixture
def project(tmp_path, tiny_csv) -> Path:
    """A user's project folder: the input data/meters.csv beside data/README.txt."""
    folder = tmp_path / "project"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "meters.csv").write_bytes(Path(tiny_csv).read_bytes())
    (folder / "data" / "README.txt").write_text(NOTES)
    return folder


def refusal(out: str | Path, path: str | Path, why: str) -> str:
    return (f"error: --out {out}: {path} {why}; a run replaces only onnxcast's own earlier output: move it away "
            "or choose another --out")


NO_RECORD = f"was not written by onnxcast (this folder has no {RECORD}, the record of what onnxcast wrote here)"
LINK = "is a symbolic link, which onnxcast never writes nor follows"


class TestTheUsersFilesAreNeverReplaced:
    def test_out_dot_in_the_project_of_the_input_is_refused_and_keeps_the_data(self, project, capsys, monkeypatch):
        """The issue's command: `--data data/meters.csv --out .` in the project."""
        monkeypatch.chdir(project)
        before = snapshot(project)
        code, errors = pipeline("data/meters.csv", ".", capsys)
        assert code == 2
        assert errors == [refusal(".", "data", NO_RECORD)]
        assert snapshot(project) == before  # not even the lock's folder or a record was left

    def test_out_the_parent_of_the_input_folder_is_refused(self, project, capsys):
        before = snapshot(project)
        code, errors = pipeline(project / "data" / "meters.csv", project, capsys)
        assert code == 2 and errors == [refusal(project, project / "data", NO_RECORD)]
        assert snapshot(project) == before

    @pytest.mark.parametrize("entry", ["models", "quality", "report.json", "config.json", "failed-report.json"])
    def test_out_the_input_folder_holding_a_name_onnxcast_writes_is_refused(self, project, capsys, entry):
        """OUT is the input's own folder, and the user keeps something there under a name a
        run writes: their own models/, quality/ notes, a report.json of another tool."""
        folder = project / "data"
        target = folder / entry
        if "." in entry:
            target.write_text('{"mine": true}\n')
        else:
            target.mkdir()
            (target / "kept.txt").write_text(NOTES)
        before = snapshot(project)
        code, errors = pipeline(folder / "meters.csv", folder, capsys)
        assert code == 2 and errors == [refusal(folder, target, NO_RECORD)]
        assert snapshot(project) == before

    def test_a_symlink_at_a_name_onnxcast_writes_is_neither_followed_nor_removed(self, project, tmp_path, capsys):
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / "precious.csv").write_text("keep me\n")
        out = tmp_path / "out"
        out.mkdir()
        (out / "models").symlink_to(elsewhere, target_is_directory=True)
        code, errors = pipeline(project / "data" / "meters.csv", out, capsys)
        assert code == 2 and errors == [refusal(out, out / "models", LINK)]
        assert (out / "models").is_symlink() and (elsewhere / "precious.csv").read_text() == "keep me\n"

    def test_out_itself_a_symlink_to_a_project_is_judged_inside_it(self, project, tmp_path, capsys):
        """OUT may be a link (the user named it): the rule applies in the folder it points to."""
        link = tmp_path / "results"
        link.symlink_to(project, target_is_directory=True)
        before = snapshot(project)
        code, errors = pipeline(project / "data" / "meters.csv", link, capsys)
        assert code == 2 and errors == [refusal(link, link / "data", NO_RECORD)]
        assert snapshot(project) == before


@pytest.mark.slow
def test_a_rerun_replaces_its_own_output_and_nothing_else(project, capsys):
    """OUT is the input's own folder, holding the input and the user's notes: the first run
    writes beside them, a rerun replaces the first run's output, a file the user added to it (or
    a link planted in it) refuses the rerun, and an output without the record is not replaced
    (see onnxcast/pipeline/ownership.py)."""
    out = project / "data"
    data = out / "meters.csv"
    user_files = {"meters.csv": data.read_bytes(), "README.txt": NOTES.encode()}

    code, errors = pipeline(data, out, capsys)
    assert (code, errors) == (0, [])
    first = json.loads((out / "report.json").read_text())
    record = json.loads((out / RECORD).read_text())["entries"]
    assert {"report.json", "config.json", "data", "models", "quality", "data/fleet/values.npy",
            "models/dlinear/onnx/fp32.onnx"} <= set(record)
    assert not set(user_files) & set(record) and ".staging" not in record
    assert {name: (out / name).read_bytes() for name in user_files} == user_files

    (out / "models" / "mine.txt").write_text(NOTES)  # the user's file inside onnxcast's folder
    before = snapshot(project)
    code, errors = pipeline(data, out, capsys)
    assert code == 2 and errors == [
        refusal(out, out / "models" / "mine.txt", f"was not written by onnxcast (not in {RECORD})")]
    assert snapshot(project) == before
    (out / "models" / "mine.txt").unlink()

    (out / "data" / "fleet" / "values.npy").unlink()  # a link planted where onnxcast wrote a file
    (out / "data" / "fleet" / "values.npy").symlink_to(data)
    code, errors = pipeline(data, out, capsys)
    assert code == 2 and errors == [refusal(out, out / "data" / "fleet" / "values.npy", LINK)]
    assert data.read_bytes() == user_files["meters.csv"]
    (out / "data" / "fleet" / "values.npy").unlink()

    code, errors = pipeline(data, out, capsys)  # the rerun over the earlier output
    assert (code, errors) == (0, [])
    second = json.loads((out / "report.json").read_text())
    assert second["created"] >= first["created"] and second["status"] == "passed"
    saved = out / "data" / "fleet" / "values.npy"
    assert saved.is_file() and not saved.is_symlink()
    assert {name: (out / name).read_bytes() for name in user_files} == user_files
    assert not os.path.lexists(out / ".staging")
    assert set(json.loads((out / RECORD).read_text())["entries"]) == set(record)

    (out / RECORD).unlink()  # an output from before the record: refused, not guessed at
    code, errors = pipeline(data, out, capsys)
    assert code == 2 and errors == [refusal(out, out / "config.json", NO_RECORD)]
