"""Deployment targets end to end (issue 33, "Done when"): one tiny pipeline run (DLinear on weekly
CO2, one epoch) with ``--targets x86_64,openvino`` through ``onnxcast.cli.main``, promoted through
it to a local store and signed; then ``onnxcast-edge`` devices (its ``main``): an x86 device with
OpenVINO installs the OpenVINO artifact by its facts and forecasts within the parity tolerance of
an x86_64 device on the same input; the signed manifest's evidence per target is the report's; a
device asking for a target the channel did not validate is refused in one line, installing
nothing and keeping its model. Marked slow, where qemu and the Arm sysroot are (make arm-tools):
the same run also validates aarch64 and the emulated aarch64 device pulls and predicts."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from rollout_support import one_error_line

from onnxcast import cli
from onnxcast.base.target_evidence import VALIDATED
from onnxcast.rollout.cli import edge_main
from onnxcast.rollout.device_runtime import OpenVinoSession
from onnxcast.rollout.device_target import DeviceFacts, preference, read_facts
from onnxcast.rollout.promote import verify_version
from onnxcast.rollout.store import open_store
from onnxcast.targets.parity import PARITY_ATOL, PARITY_RTOL
from onnxcast.targets.runners import emulation_unavailable

TINY = ["--models", "dlinear", "--max-epochs", "1", "--horizon", "12", "--lookback", "56", "--latency-repeats", "3",
        "--coverage-tolerance", "0.2"]
ARM_TEST = "test_an_emulated_aarch64_device_pulls_its_variant_and_matches_x86"
MODEL, CHANNEL, VERSION = "co2", "edge", "1"
needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="openvino is not installed")


@dataclass(frozen=True)
class Release:
    run: Path          # the pipeline's --out
    store: str
    targets: tuple[str, ...]
    report: dict
    manifest: dict     # verified against the release key
    table: Path        # the devices' input: the newest weeks of the series


@pytest.fixture(scope="module")
def release(request, tmp_path_factory, release_key) -> Release:
    """The run (once per module; with aarch64 too where the emulated test is selected and can run),
    promoted to the edge channel of a local store, signed with the session's release key."""
    from real_series import weekly_co2_csv

    with_arm = any(item.name == ARM_TEST for item in request.session.items) and not emulation_unavailable()
    targets = ("x86_64", "openvino", "aarch64") if with_arm else ("x86_64", "openvino")
    root = tmp_path_factory.mktemp("targets-e2e")
    out, store = root / "run", str(root / "store")
    printed, err = io.StringIO(), io.StringIO()
    with redirect_stdout(printed), redirect_stderr(err):
        code = cli.main(["pipeline", "--data", weekly_co2_csv(), "--out", str(out), *TINY,
                         "--targets", ",".join(targets)])
        assert code == 0, err.getvalue()
        code = cli.main(["promote", "--report", str(out), "--store", store, "--model", MODEL, "--channel", CHANNEL,
                         "--version", VERSION, "--reason", "targets end to end",
                         "--signing-key", str(release_key["private"])])
        assert code == 0, err.getvalue()
    manifest, _ = verify_version(open_store(store), MODEL, VERSION)
    lines = Path(weekly_co2_csv()).read_text().splitlines()
    table = root / "newest.csv"
    table.write_text("\n".join([lines[0], *lines[-120:]]) + "\n")
    report = json.loads((out / "report.json").read_text())
    return Release(out, store, targets, report, manifest, table)


def pull(release: Release, dest: Path, *target: str) -> int:
    return edge_main(["pull", "--store", release.store, "--model", MODEL, "--channel", CHANNEL, "--dest", str(dest),
                      *(("--target", *target) if target else ())])


def predict(dest: Path, capsys) -> tuple[np.ndarray, np.ndarray]:
    """``onnxcast-edge predict``'s forecast [steps] and quantiles [steps, levels], from its CSV."""
    capsys.readouterr()
    assert edge_main(["predict", "--dir", str(dest), "--input", str(dest.parent / "in.csv")]) == 0
    return table_figures(capsys.readouterr().out)


def table_figures(text: str) -> tuple[np.ndarray, np.ndarray]:
    rows = list(csv.DictReader(io.StringIO(text)))
    forecast = np.array([float(r["forecast"]) for r in rows])
    quantiles = np.array([[float(r[c]) for c in r if c.startswith("q")] for r in rows])
    return forecast, quantiles


def status(dest: Path, capsys) -> dict:
    capsys.readouterr()
    assert edge_main(["status", "--dir", str(dest)]) == 0
    return json.loads(capsys.readouterr().out)


def compare(name: str, got: tuple[np.ndarray, np.ndarray], x86: tuple[np.ndarray, np.ndarray], channel_x86: str,
            capsys) -> None:
    """The pipeline's parity measure (|a-b| / (atol + rtol*|b|), <= 1 passes), its figures printed."""
    level = float(np.mean(np.abs(x86[0])))
    for what, a, b in (("forecast", got[0], x86[0]), ("quantiles", got[1], x86[1])):
        assert a.shape == b.shape and a.size, (what, a.shape, b.shape)
        ratio = float(np.max(np.abs(a - b) / (PARITY_ATOL + PARITY_RTOL * np.abs(b))))
        with capsys.disabled():  # the figures, shown with pytest -s
            print(f"\n{name} vs the x86_64 device ({channel_x86}) {what}: tolerance ratio {ratio:.3g}, "
                  f"max |diff| / level {float(np.max(np.abs(a - b))) / level:.2g}")
        assert ratio <= 1, (what, ratio)


def channel_pick(release: Release, target: str) -> dict:
    return release.manifest["channels"][CHANNEL]["targets"][target]


@needs_openvino
def test_an_openvino_device_installs_its_artifact_and_forecasts_as_an_x86_device(release, tmp_path, capsys,
                                                                                   monkeypatch):
    monkeypatch.delenv("ONNXCAST_EDGE_TARGET", raising=False)
    assert preference(read_facts()).targets[0] == "openvino", "this x86 machine should prefer OpenVINO"
    (tmp_path / "in.csv").write_bytes(release.table.read_bytes())
    ov, x86 = tmp_path / "ov", tmp_path / "x86"
    assert pull(release, ov) == 0  # no --target: the device's facts choose openvino
    assert pull(release, x86, "x86_64") == 0
    ov_status, x86_status = status(ov, capsys), status(x86, capsys)
    assert ov_status["version"] == VERSION and ov_status["target"]["override"] is None
    assert (ov_status["target"]["name"], ov_status["target"]["runtime"]) == ("openvino", "openvino")
    assert ov_status["artifact"] == channel_pick(release, "openvino")["artifact"]
    assert (x86_status["target"]["name"], x86_status["artifact"]) == ("x86_64", channel_pick(release, "x86_64")["artifact"])
    assert ov_status["target"]["variant"] == release.report["selected"][CHANNEL]["targets"]["openvino"]["variant"]
    runs = []  # OpenVINO's own inferences (the real ones, counted): the forecast is OpenVINO's
    real_run = OpenVinoSession.run
    monkeypatch.setattr(OpenVinoSession, "run", lambda self, *a: runs.append(1) or real_run(self, *a))
    from_openvino = predict(ov, capsys)
    assert runs, "the openvino device did not forecast with OpenVINO"
    compare(f"openvino device ({ov_status['artifact']})", from_openvino, predict(x86, capsys),
            x86_status["artifact"], capsys)


def test_the_signed_manifest_carries_the_reports_evidence_per_target(release):
    selected = release.report["selected"][CHANNEL]
    assert release.report["targets"] == list(release.targets)
    assert set(selected["targets"]) == set(release.targets), selected.get("targets_missing")
    (model,) = release.report["models"]
    variants = {v["name"]: v for v in model["variants"]}
    for target in release.targets:
        pick = channel_pick(release, target)
        assert (pick["family"], pick["variant"]) == (selected["family"], selected["targets"][target]["variant"])
        variant = variants[pick["variant"]]
        record = variant["targets"][target]
        artifact = release.manifest["artifacts"][pick["artifact"]]
        assert artifact["sha256"] == variant["sha256"]
        entry = artifact["targets"][target]
        assert entry["status"] == record["status"] == VALIDATED
        assert set(entry["evidence"]) >= {"parity", "holdout", "latency_ms", "latency_note", "environment",
                                          "size_bytes"}
        for field, value in entry["evidence"].items():
            assert value == record[field], (target, field)
    openvino = channel_pick(release, "openvino")["artifact"]
    evidence = release.manifest["artifacts"][openvino]["targets"]["openvino"]["evidence"]
    assert evidence["parity"]["vs_x86"]["passed"] and "openvino" in evidence["environment"]["runtimes"]


def test_a_target_the_channel_did_not_validate_is_refused_keeping_the_model(release, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ONNXCAST_EDGE_TARGET", raising=False)
    dest = tmp_path / "device"
    assert pull(release, dest, "x86_64") == 0
    before = (dest / "current").readlink(), (dest / "current" / "pulled.json").read_bytes()

    def unchanged() -> None:
        assert ((dest / "current").readlink(), (dest / "current" / "pulled.json").read_bytes()) == before
        assert not [p for p in dest.iterdir() if p.name.startswith(".staging")]

    capsys.readouterr()
    assert pull(release, dest, "aarch64") == 2  # this x86 device cannot run it at all
    one_error_line(capsys, "target 'aarch64' runs on aarch64, this device is x86_64")
    unchanged()

    # an Arm device (its facts as read_facts reports them there) naming a target the run did not validate
    missing = "tvm-aarch64" if "aarch64" in release.targets else "aarch64"
    arm = DeviceFacts("aarch64", ("asimd",), {"onnxruntime": "1.32.0", "tvm": "0.27.0"}, ("CPUExecutionProvider",))
    monkeypatch.setattr("onnxcast.rollout.edge.read_facts", lambda: arm)
    shown = ", ".join(sorted(release.targets))
    assert pull(release, dest, missing) == 1
    one_error_line(capsys, f"target {missing!r} (named by --target or ONNXCAST_EDGE_TARGET) is not validated for "
                           f"channel {CHANNEL!r} (validated: {shown}); refusing version {VERSION} (still serving "
                           f"version {VERSION})")
    unchanged()
    assert pull(release, tmp_path / "fresh", missing) == 1
    one_error_line(capsys, "(nothing installed)")
    assert not (tmp_path / "fresh" / "current").exists()


@pytest.mark.slow
def test_an_emulated_aarch64_device_pulls_its_variant_and_matches_x86(release, tmp_path, capsys, monkeypatch):
    """qemu-user and the Arm sysroot (make arm-tools): the run validated aarch64 too, and Debian's
    arm64 Python runs ``onnxcast-edge`` (tests/onnxcast/rollout/test_device_aarch64.py's device)."""
    if "aarch64" not in release.targets:
        pytest.skip(emulation_unavailable() or "the run did not validate aarch64")
    spec = importlib.util.spec_from_file_location(
        "device_aarch64_helpers", Path(__file__).resolve().parents[1] / "rollout" / "test_device_aarch64.py")
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    device = helpers.emulated_device()
    monkeypatch.delenv("ONNXCAST_EDGE_TARGET", raising=False)
    (tmp_path / "in.csv").write_bytes(release.table.read_bytes())
    arm, x86 = tmp_path / "arm", tmp_path / "x86"
    done = helpers.run_device(device, "pull", "--store", release.store, "--model", MODEL, "--channel", CHANNEL,
                              "--dest", str(arm))
    assert done.returncode == 0 and "target aarch64" in done.stdout, done.stderr
    shown = json.loads(helpers.run_device(device, "status", "--dir", str(arm)).stdout)
    assert shown["artifact"] == channel_pick(release, "aarch64")["artifact"]
    assert shown["target"]["facts"]["machine"] == "aarch64"
    done = helpers.run_device(device, "predict", "--dir", str(arm), "--input", str(tmp_path / "in.csv"))
    assert done.returncode == 0, done.stderr
    assert pull(release, x86, "x86_64") == 0
    compare(f"aarch64 device under qemu ({shown['artifact']})", table_figures(done.stdout), predict(x86, capsys),
            channel_pick(release, "x86_64")["artifact"], capsys)
