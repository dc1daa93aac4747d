"""Promotion and rollback on both store backends: what a version holds, racing
promotions, crashes midway, reruns, immutability, bad input and the CLI."""

from __future__ import annotations

import json
import os
import threading

import pytest

from onnxcast import cli
from onnxcast.base.errors import ConfigError, ConflictError, StoreError, VerificationError
from onnxcast.base.s3 import S3Settings
from onnxcast.rollout.promote import ReportError, promote, rollback, verify_version
from onnxcast.rollout.store import LocalStore, open_store


class SimulatedCrash(Exception):
    """Stands for the promoting process dying at this point."""


class TestPromote:
    def test_version_holds_every_artifact_with_its_checks(self, store_uri, make_run):
        report = make_run("a")
        result = promote(report, store_uri, "m", ["edge"], actor="ci", reason="first")
        store = open_store(store_uri)
        manifest = store.read_manifest("m", result.version)
        assert result.changed and result.channels == {"edge": "moved"}
        assert set(result.written) == {"lstm-fp32.onnx", "lstm-fp32-opt.onnx", "manifest.json"}
        # a report from before deployment targets: x86_64, validated by the variant's own validation
        edge = {"artifact": "lstm-fp32-opt.onnx", "family": "lstm", "variant": "fp32-opt"}
        cloud = {"artifact": "lstm-fp32.onnx", "family": "lstm", "variant": "fp32"}
        assert manifest["channels"] == {"edge": {**edge, "targets": {"x86_64": edge}},
                                        "cloud": {**cloud, "targets": {"x86_64": cloud}}}
        entry = manifest["artifacts"]["lstm-fp32-opt.onnx"]
        assert set(entry["targets"]) == {"x86_64"} and entry["targets"]["x86_64"]["status"] == "validated"
        evidence = entry["targets"]["x86_64"]["evidence"]
        assert evidence["holdout"]["mae"] == entry["holdout"]["mae"] and evidence["latency_ms"] == entry["latency_ms"]
        assert evidence["parity"]["vs_torch"]["max_abs_diff"] == entry["parity_max_abs_diff"]
        assert evidence["size_bytes"] == entry["size_bytes"] and evidence["latency_note"] is None
        assert entry["sha256"] == json.loads(report.read_text())["models"][0]["variants"][1]["sha256"]
        assert entry["signature"]["inputs"] == [{"name": "history", "dtype": "float32", "shape": ["batch", "time", 2]}]
        assert entry["opset"] > 0 and entry["holdout"]["mae"] == 1.0 and entry["metadata"]["target"] == "y"
        assert manifest["onnxruntime_version"] and manifest["dataset"]["sha256"] == "cd" * 32
        assert manifest["created_by"] == "ci"
        pointer = store.read_channel("m", "edge").value
        assert (pointer["version"], pointer["artifact"]) == (result.version, "lstm-fp32-opt.onnx")
        assert pointer["history"] == [{"action": "promote", "version": result.version, "from_version": None,
                                       "variant": "fp32-opt", "family": "lstm", "by": "ci",
                                       "at": pointer["updated_at"], "reason": "first"}]
        assert store.read_channel("m", "cloud").value is None  # selected in the version, not moved

    def test_the_manifest_says_what_the_intervals_of_each_artifact_may_be_relied_on_for(self, tmp_path, make_run):
        """Issue 30: intervals that were not judged (too few independent holdout windows) or were
        recalibrated ship; the signed manifest carries their status to the device and its users."""
        report = make_run("a", quantiles=True)
        document = json.loads(report.read_text())
        for variant, status in zip(document["models"][0]["variants"], ("not_judged", "recalibrated"), strict=True):
            variant["intervals_status"] = status
        report.write_text(json.dumps(document))
        result = promote(report, str(tmp_path / "store"), "m", ["edge"], actor="ci", reason="first")
        artifacts = open_store(str(tmp_path / "store")).read_manifest("m", result.version)["artifacts"]
        assert artifacts["lstm-fp32.onnx"]["intervals_status"] == "not_judged"
        assert artifacts["lstm-fp32-opt.onnx"]["intervals_status"] == "recalibrated"

    def test_rerun_is_a_noop(self, store_uri, make_run):
        report = make_run("a")
        first = promote(report, store_uri, "m", "edge,cloud")
        store = open_store(store_uri)
        before = store.read_channel("m", "edge").raw
        again = promote(report, store_uri, "m", ["edge", "cloud"])
        assert again.version == first.version and not again.changed
        assert again.written == () and again.channels == {"edge": "unchanged", "cloud": "unchanged"}
        assert store.read_channel("m", "edge").raw == before

    def test_version_ids(self, tmp_path, make_run):
        store = str(tmp_path / "store")
        derived = promote(make_run("a"), store, "m", "edge").version
        assert derived.startswith("cdcdcdcd-") and promote(make_run("a"), store, "m", "edge").version == derived
        assert promote(make_run("b"), store, "m", "edge").version != derived
        assert promote(make_run("c", mlflow_version="7"), store, "m", "edge").version == "7"
        assert promote(make_run("d"), store, "m", "edge", version="2026-11-29.1").version == "2026-11-29.1"

    @pytest.mark.slow
    def test_racing_promotions_have_one_winner(self, store_uri, make_run):
        report = make_run("a")
        promote(report, store_uri, "m", "edge", version="old")
        barrier, outcomes = threading.Barrier(8), {}

        def run(i: int) -> None:
            store = open_store(store_uri)
            create = store.create

            def create_after_everyone_read(key, data):  # all 8 read the pointer first
                if not getattr(store, "waited", False):
                    store.waited = True
                    barrier.wait()
                return create(key, data)

            store.create = create_after_everyone_read
            try:
                promote(report, store, "m", "edge", version=f"v{i}")
                outcomes[i] = "won"
            except ConflictError as exc:
                outcomes[i] = str(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        winners = [i for i, o in outcomes.items() if o == "won"]
        assert len(outcomes) == 8 and len(winners) == 1, outcomes
        assert all("moved by another promotion" in o for o in outcomes.values() if o != "won")
        store = open_store(store_uri)
        pointer = store.read_channel("m", "edge").value
        assert pointer["version"] == f"v{winners[0]}"
        assert [h["version"] for h in pointer["history"]] == ["old", f"v{winners[0]}"]
        verify_version(store, "m", pointer["version"])  # complete and intact

    def test_crash_midway_keeps_old_pointer_and_rerun_completes(self, store_uri, make_run):
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        store = open_store(store_uri)
        _fail_nth_write(store, 2)  # the second artifact upload
        with pytest.raises(SimulatedCrash):
            promote(make_run("b"), store, "m", "edge", version="2")
        fresh = open_store(store_uri)
        assert fresh.read_channel("m", "edge").value["version"] == "1"
        assert fresh.read_manifest("m", "2") is None and "2" in fresh.list_versions("m")
        result = promote(make_run("b"), fresh, "m", "edge", version="2")
        assert result.skipped == ("lstm-fp32-opt.onnx",)  # uploaded before the crash
        assert "manifest.json" in result.written and result.channels == {"edge": "moved"}
        assert fresh.read_channel("m", "edge").value["version"] == "2"

    def test_crash_before_the_pointer_moves(self, store_uri, make_run, monkeypatch):
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        store = open_store(store_uri)
        monkeypatch.setattr(store, "replace_pointer", _raise_crash)
        with pytest.raises(SimulatedCrash):
            promote(make_run("b"), store, "m", "edge", version="2")
        fresh = open_store(store_uri)
        assert fresh.read_channel("m", "edge").value["version"] == "1"
        verify_version(fresh, "m", "2")  # complete, not yet pointed to
        result = promote(make_run("b"), fresh, "m", "edge", version="2")
        assert result.written == () and result.channels == {"edge": "moved"}

    @pytest.mark.slow
    def test_s3_gone_midway(self, s3_bucket, make_run):
        from botocore.exceptions import EndpointConnectionError

        uri = f"s3://{s3_bucket}/rollout"
        promote(make_run("a"), uri, "m", "edge", version="1")
        store = open_store(uri, S3Settings.from_values({"max_attempts": 2}))
        calls = []

        def down(request, **_):
            calls.append(request.url)
            if len(calls) > 1:  # the server is gone after the first upload
                raise EndpointConnectionError(endpoint_url=request.url)

        store.client.meta.events.register("before-send.s3.PutObject", down)
        store.client.meta.events.register("before-send.s3.GetObject", lambda request, **_: down(request) if calls else None)
        with pytest.raises(StoreError, match="cannot (write to|read from) S3"):
            promote(make_run("b"), store, "m", "edge", version="2")
        fresh = open_store(uri)
        assert fresh.read_channel("m", "edge").value["version"] == "1" and fresh.read_manifest("m", "2") is None
        assert promote(make_run("b"), fresh, "m", "edge", version="2").channels == {"edge": "moved"}

    def test_different_bytes_under_an_existing_key_are_refused(self, store_uri, make_run):
        store = open_store(store_uri)
        store.create(store.version_key("m", "1", "lstm-fp32.onnx"), b"not the model")
        with pytest.raises(ConflictError, match=r"versions/1/lstm-fp32.onnx: already exists with different bytes"):
            promote(make_run("a"), store, "m", "edge", version="1")
        assert store.read_manifest("m", "1") is None and store.read_channel("m", "edge").value is None

    def test_version_id_reused_for_other_models_is_refused(self, store_uri, make_run):
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        with pytest.raises(ConflictError, match="version 1 already exists with different artifacts"):
            promote(make_run("b"), store_uri, "m", "edge", version="1")

    def test_the_same_models_promoted_again_with_another_variant_choice_move_to_the_stored_version(
            self, store_uri, make_run):
        """An alias set back on a registered version in MLflow re-validates it: latency may now
        choose another of its variants. The stored (immutable) version is what the channel gets."""
        import json

        report = make_run("a")
        promote(report, store_uri, "m", "edge", version="1")
        promote(make_run("b"), store_uri, "m", "edge", version="2")
        again = json.loads(report.read_text())
        again["selected"]["edge"] = {"family": "lstm", "variant": "fp32"}
        report.write_text(json.dumps(again))
        result = promote(report, store_uri, "m", "edge", version="1")
        assert result.channels == {"edge": "moved"} and result.written == ()
        store = open_store(store_uri)
        assert store.read_channel("m", "edge").value["version"] == "1"
        assert store.read_manifest("m", "1")["channels"]["edge"]["variant"] == "fp32-opt"
        # an ineligible variant now (a gate failed on re-validation) is not the same model
        again["models"][0]["variants"][1]["eligible"] = False
        again["selected"]["edge"] = {"family": "lstm", "variant": "fp32"}
        report.write_text(json.dumps(again))
        with pytest.raises(ConflictError, match="version 1 already exists with different artifacts"):
            promote(report, store_uri, "m", "cloud", version="1")

    def test_tampered_version_fails_verification_before_the_pointer_moves(self, tmp_path, make_run):
        store = LocalStore(tmp_path / "store")
        version = promote(make_run("a"), store, "m", "cloud").version
        path = tmp_path / "store" / "m" / "versions" / version / "lstm-fp32-opt.onnx"
        path.write_bytes(path.read_bytes()[:-1] + b"\0")
        with pytest.raises(VerificationError, match="lstm-fp32-opt.onnx: sha256 .* does not match the manifest"):
            promote(make_run("a"), store, "m", "edge")
        assert store.read_channel("m", "edge").value is None


class TestBadInput:
    """Each is refused in one line naming what is wrong, and nothing is written."""

    def test_missing_report(self, tmp_path):
        with pytest.raises(ReportError, match=r"nope: report not found"):
            promote(tmp_path / "nope", str(tmp_path / "store"), "m", "edge")
        (tmp_path / "run").mkdir()
        with pytest.raises(ReportError, match=r"run/report.json: report not found"):
            promote(tmp_path / "run", str(tmp_path / "store"), "m", "edge")
        assert not (tmp_path / "store").exists()

    @pytest.mark.parametrize("change, message", [
        (lambda r, d: (d / "models/lstm/onnx/fp32.onnx").unlink(), r"fp32.onnx: cannot read the lstm/fp32 model"),
        (lambda r, d: r["models"][0]["variants"][0].update(sha256="0" * 64), r"fp32.onnx: sha256 \w+ does not match the report's 000000000000"),
        (lambda r, d: r["models"][0]["variants"][0].update(onnx_path="../../etc/passwd"), "points outside the report folder"),
        (lambda r, d: r["models"][0]["variants"][0].update(eligible=False, reasons=["parity 0.1 > 1e-4"]), r"lstm/fp32 is not eligible \(parity"),
        (lambda r, d: r["selected"].update(edge={"family": "transformer", "variant": "int8"}), "transformer/int8 is not in the report"),
        (lambda r, d: r.update(status="failed"), "status is 'failed'"),
        (lambda r, d: r.pop("models"), "not a pipeline report"),
    ])
    def test_bad_report(self, tmp_path, make_run, change, message):
        path = make_run("a")
        report = json.loads(path.read_text())
        change(report, path.parent)
        path.write_text(json.dumps(report))
        with pytest.raises(ReportError, match=message) as info:
            promote(path, str(tmp_path / "store"), "m", "edge")
        assert "\n" not in str(info.value)
        assert not (tmp_path / "store").exists()

    def test_not_json(self, tmp_path):
        (tmp_path / "report.json").write_text("{")
        with pytest.raises(ReportError, match="report.json' is not valid JSON"):
            promote(tmp_path, str(tmp_path / "store"), "m", "edge")

    @pytest.mark.parametrize("hostile, message", [
        (lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "nested deeper than 64 levels"),
        (lambda p: os.mkfifo(p), "is not a regular file (a FIFO)"),
    ], ids=["deep", "fifo"])
    def test_a_hostile_report_file_is_one_line_through_the_command(self, tmp_path, capsys, hostile, message):
        """`onnxcast promote --report` reads the report as untrusted input: 100,000 nested
        brackets gave a RecursionError traceback, a FIFO would block the read."""
        from onnxcast import cli

        hostile(tmp_path / "report.json")
        code = cli.main(["promote", "--report", str(tmp_path / "report.json"), "--store", str(tmp_path / "store"),
                         "--model", "m", "--channel", "edge"])
        err = capsys.readouterr().err
        assert code == 1 and message in err and "Traceback" not in err, err  # 1: a report error (README)
        assert len(err.strip().splitlines()) == 1 and not (tmp_path / "store").exists()

    def test_unknown_channel(self, tmp_path, make_run):
        with pytest.raises(ReportError, match=r"unknown channel\(s\) \['staging'\]; the report selects \['cloud', 'edge'\]"):
            promote(make_run("a"), str(tmp_path / "store"), "m", ["edge", "staging"])
        assert not (tmp_path / "store").exists()

    def test_model_violating_the_contract(self, tmp_path, make_run):
        import onnx

        path = make_run("a")
        onnx_file = path.parent / "models/lstm/onnx/fp32.onnx"
        proto = onnx.load(onnx_file)
        proto.graph.output[0].name = "prediction"
        proto.graph.node[-1].output[0] = "prediction"
        onnx.save(proto, onnx_file)
        report = json.loads(path.read_text())
        report["models"][0]["variants"][0]["sha256"] = __import__("hashlib").sha256(onnx_file.read_bytes()).hexdigest()
        path.write_text(json.dumps(report))
        with pytest.raises(VerificationError, match=r"expected outputs 'forecast' or \['forecast', 'quantiles'\], "
                                                   r"found \['prediction'\]"):
            promote(path, str(tmp_path / "store"), "m", "edge")
        assert not (tmp_path / "store").exists()

    @pytest.mark.parametrize("uri", ["gs://b/x", "s3://Bad_Bucket/x", ""])
    def test_bad_store_uri_through_the_cli(self, tmp_path, make_run, uri, capsys):
        assert _cli("promote", "--report", str(make_run("a")), "--store", uri, "--model", "m", "--channel", "edge") == 2
        err = capsys.readouterr().err
        assert "store URI" in err and len(err.splitlines()) == 1 and "Traceback" not in err

    def test_bad_model_name(self, tmp_path, make_run):
        with pytest.raises(ConfigError, match=r"invalid model name '../m'"):
            promote(make_run("a"), str(tmp_path / "store"), "../m", "edge")


class TestRollback:
    def test_back_and_forth_with_history(self, store_uri, make_run):
        promote(make_run("a"), store_uri, "m", "edge", version="1", actor="ci")
        promote(make_run("b"), store_uri, "m", "edge", version="2", actor="ci")
        promote(make_run("c"), store_uri, "m", "edge", version="3", actor="ci")
        result = rollback(store_uri, "m", "edge", actor="alice", reason="MAE regression")
        assert (result.from_version, result.version, result.changed) == ("3", "2", True)
        assert rollback(store_uri, "m", "edge", actor="alice", reason="still bad").version == "1"
        with pytest.raises(StoreError, match="no version before 1 in the channel history; pass --to VERSION"):
            rollback(store_uri, "m", "edge", reason="again")
        assert rollback(store_uri, "m", "edge", to_version="3", actor="bob", reason="fixed").version == "3"
        store = open_store(store_uri)
        pointer = store.read_channel("m", "edge").value
        assert pointer["version"] == "3"
        assert [(h["action"], h["version"], h["from_version"], h["by"], h["reason"]) for h in pointer["history"]] == [
            ("promote", "1", None, "ci", ""), ("promote", "2", "1", "ci", ""), ("promote", "3", "2", "ci", ""),
            ("rollback", "2", "3", "alice", "MAE regression"), ("rollback", "1", "2", "alice", "still bad"),
            ("rollback", "3", "1", "bob", "fixed")]
        assert store.list_versions("m") == ["1", "2", "3"]  # never deleted
        assert not rollback(store_uri, "m", "edge", to_version="3", reason="noop").changed

    def test_refusals(self, tmp_path, make_run):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "edge", version="1")
        with pytest.raises(StoreError, match="channels/cloud.json: no such channel for model 'm'"):
            rollback(store, "m", "cloud", reason="x")
        with pytest.raises(StoreError, match="version 9 of 'm' not found"):
            rollback(store, "m", "edge", to_version="9", reason="x")
        with pytest.raises(ConfigError, match="a rollback needs a reason"):
            rollback(store, "m", "edge", to_version="1", reason=" ")

    def test_rollback_to_a_tampered_version_is_refused(self, tmp_path, make_run):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "edge", version="1")
        promote(make_run("b"), store, "m", "edge", version="2")
        (tmp_path / "store/m/versions/1/lstm-fp32-opt.onnx").write_bytes(b"evil")
        with pytest.raises(VerificationError, match="versions/1/lstm-fp32-opt.onnx: sha256"):
            rollback(store, "m", "edge", reason="x")
        assert open_store(store).read_channel("m", "edge").value["version"] == "2"


class TestCli:
    def test_promote_and_rollback(self, tmp_path, make_run, capsys):
        store = str(tmp_path / "store")
        assert _cli("promote", "--report", str(make_run("a")), "--store", store, "--model", "m",
                    "--channel", "edge", "--channel", "cloud", "--version", "1", "--reason", "weekly") == 0
        assert "m version 1 at" in capsys.readouterr().out
        _cli("promote", "--report", str(make_run("b")), "--store", store, "--model", "m", "--channel", "edge")
        assert _cli("rollback", "--store", store, "--model", "m", "--channel", "edge", "--reason", "bad") == 0
        assert "rolled back from " in capsys.readouterr().out
        assert open_store(store).read_channel("m", "edge").value["version"] == "1"

    def test_rollback_needs_a_reason(self, tmp_path):
        with pytest.raises(SystemExit):
            _cli("rollback", "--store", str(tmp_path), "--model", "m", "--channel", "edge")

    def test_errors_are_one_line_without_traceback(self, tmp_path, capsys):
        code = _cli("promote", "--report", str(tmp_path / "x.json"), "--store", str(tmp_path), "--model", "m",
                    "--channel", "edge")
        err = capsys.readouterr().err
        assert code in (1, 2) and err.startswith("error: ") and "report not found" in err
        assert len(err.splitlines()) == 1


def _cli(*argv: str) -> int:
    """The real entry point (the ``onnxcast`` console script calls ``cli.main``)."""
    return cli.main(list(argv))


def _raise_crash(*args, **kwargs):
    raise SimulatedCrash("the promoting process died here")


def _fail_nth_write(store, n: int) -> None:
    """Crash on the ``n``-th write: a botocore hook on S3 (the request never leaves), a
    wrapped ``create`` locally."""
    count = [0]
    if hasattr(store, "client"):
        def before_send(request, **_):
            count[0] += 1
            if count[0] == n:
                raise SimulatedCrash(f"died while sending {request.url}")

        store.client.meta.events.register("before-send.s3.PutObject", before_send)
    else:
        create = store.create

        def failing(key, data):
            count[0] += 1
            if count[0] == n:
                raise SimulatedCrash(f"died while writing {key}")
            return create(key, data)

        store.create = failing


def test_store_and_promote_import_light_for_airflow():
    """Operators import these at task run time, and DAG files must parse fast."""
    import subprocess
    import sys

    code = ("import sys, onnxcast.rollout.store, onnxcast.rollout.promote, onnxcast.rollout.cli\n"
            "print(sorted(m for m in ('boto3', 'onnx', 'onnxruntime', 'torch', 'numpy', 'pandas') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
