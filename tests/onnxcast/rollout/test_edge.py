"""The edge client: pull verifies and swaps atomically, refuses what does not verify while
the old model keeps serving, predict matches onnxruntime, watch polls."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest

from onnxcast import cli
from onnxcast.base.errors import ConfigError, DataError, RefusedError, StoreError, VerificationError
from onnxcast.base.files import sha256_bytes
from onnxcast.rollout.edge import inspect_model, predict, pull, watch
from onnxcast.rollout.promote import promote
from onnxcast.rollout.signing import load_signers, sign_envelope
from onnxcast.rollout.store import dump_json, open_store


@pytest.fixture
def history_csv(tmp_path):
    """40 rows of ds, y, x1 (the model reads the last 16 of y and x1)."""
    rng = np.random.default_rng(0)
    path = tmp_path / "history.csv"
    lines = ["ds,y,x1"] + [f"2026-01-01T{i % 24:02d}:00:00Z,{100 + 10 * np.sin(i / 3) + rng.normal():.4f},{5 + rng.normal():.4f}"
                           for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return path


class TestPull:
    def test_install_swap_and_keep_previous(self, store_uri, make_run, tmp_path):
        dest = tmp_path / "device"
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        first = pull(store_uri, "m", "edge", dest)
        assert first.changed and first.version == "1"
        assert (dest / "current").is_symlink() and (dest / "current").readlink().as_posix() == "versions/1"
        pulled = json.loads((dest / "current" / "pulled.json").read_text())
        assert pulled["artifact"] == "lstm-fp32-opt.onnx" and pulled["version"] == "1"
        assert not pull(store_uri, "m", "edge", dest).changed  # nothing new

        promote(make_run("b"), store_uri, "m", "edge", version="2")
        second = pull(store_uri, "m", "edge", dest)
        assert (second.version, second.previous) == ("2", "1")
        assert (dest / "current").readlink().as_posix() == "versions/2"
        assert (dest / "previous").readlink().as_posix() == "versions/1"
        promote(make_run("c"), store_uri, "m", "edge", version="3")
        pull(store_uri, "m", "edge", dest)
        assert sorted(p.name for p in (dest / "versions").iterdir()) == ["2", "3"]  # current + previous

    def test_tampered_artifact_is_refused_and_old_model_keeps_serving(self, store_uri, make_run, tmp_path, history_csv):
        dest = tmp_path / "device"
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        pull(store_uri, "m", "edge", dest)
        before = predict(dest, history_csv, out=io.StringIO()).forecast
        promote(make_run("b"), store_uri, "m", "edge", version="2")
        _overwrite(store_uri, "m/versions/2/lstm-fp32-opt.onnx", lambda data: data[:-4] + b"evil")
        with pytest.raises(RefusedError, match=r"versions/2/lstm-fp32-opt.onnx: sha256 \w+ \(\d+ bytes\) does not "
                                               r"match the signed \w+ \(\d+ bytes\); refusing version 2 "
                                               r"\(still serving version 1\)"):
            pull(store_uri, "m", "edge", dest)
        assert (dest / "current").readlink().as_posix() == "versions/1"
        assert np.array_equal(predict(dest, history_csv, out=io.StringIO()).forecast, before)
        assert [p.name for p in dest.iterdir() if p.name.startswith(".staging")] == []

    def test_tampered_manifest_is_refused(self, store_uri, make_run, tmp_path):
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        _overwrite(store_uri, "m/versions/1/manifest.json", lambda data: data.replace(b'"reason": ""', b'"reason": "x"'))
        with pytest.raises(RefusedError, match="manifest.json: longer than its signed length of \\d+ bytes"):
            pull(store_uri, "m", "edge", tmp_path / "device")
        assert not (tmp_path / "device" / "current").exists()

    def test_model_with_external_data_outside_the_folder_is_refused(self, tmp_path, make_run, tiny_onnx):
        """A pointer and manifest signed by the release key, for a model reaching outside its
        folder (a compromised release key): refused before ONNX Runtime opens it."""
        import onnx

        proto = onnx.load(tiny_onnx)
        tensor = proto.graph.initializer[0]
        tensor.ClearField("raw_data")
        del tensor.float_data[:]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value="../../../etc/passwd")
        data = proto.SerializeToString()
        store = open_store(str(tmp_path / "store"))
        version = promote(make_run("a"), store, "m", "edge", version="1").version
        manifest = store.read_manifest("m", version)
        manifest["artifacts"]["evil.onnx"] = {**manifest["artifacts"]["lstm-fp32-opt.onnx"],
                                              "sha256": sha256_bytes(data), "size_bytes": len(data)}
        manifest["channels"]["edge"]["artifact"] = "evil.onnx"
        # a device installs the artifact its target names (docs/targets.md): name the evil one there too
        for choice in manifest["channels"]["edge"].get("targets", {}).values():
            choice["artifact"] = "evil.onnx"
        manifest["version"] = "2"
        signers = load_signers()
        manifest_bytes = dump_json(sign_envelope(manifest, signers))
        store.create(store.version_key("m", "2", "evil.onnx"), data)
        store.create(store.version_key("m", "2"), manifest_bytes)
        pointer = store.read_channel("m", "edge")
        store.replace_pointer(store.channel_key("m", "edge"), sign_envelope({
            **pointer.value, "version": "2", "artifact": "evil.onnx", "sha256": sha256_bytes(data), "length": len(data),
            "counter": pointer.value["counter"] + 1,
            "manifest": {"sha256": sha256_bytes(manifest_bytes), "length": len(manifest_bytes)}}, signers), pointer.token)
        with pytest.raises(VerificationError, match=r"references external data '../../../etc/passwd' \(outside the model folder\)"):
            pull(str(tmp_path / "store"), "m", "edge", tmp_path / "device")
        assert not (tmp_path / "device" / "current").exists()

    def test_unknown_channel_and_missing_store(self, tmp_path, make_run):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "edge")
        with pytest.raises(StoreError, match="channels/cloud.json: no such channel for model 'm'"):
            pull(store, "m", "cloud", tmp_path / "device")
        with pytest.raises(StoreError, match="no such channel"):
            pull(str(tmp_path / "elsewhere"), "m", "edge", tmp_path / "device")


class TestInspect:
    def test_contract_violations_are_listed(self, tmp_path, tiny_onnx):
        import onnx

        proto = onnx.load(tiny_onnx)
        proto.graph.input[0].name = "x"
        proto.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
        path = tmp_path / "bad.onnx"
        onnx.save(proto, path)
        with pytest.raises(VerificationError, match=r"bad.onnx: expected inputs 'history', found \['x'\]"):
            inspect_model(path)

    def test_signature_must_match_the_manifest(self, tiny_onnx):
        expected = inspect_model(tiny_onnx).signature
        changed = json.loads(json.dumps(expected))
        changed["outputs"][0]["shape"] = ["batch", 8]
        with pytest.raises(VerificationError, match="differs from the manifest's"):
            inspect_model(tiny_onnx, expected_signature=changed)

    def test_signature_is_the_contract_modules(self, tiny_onnx):
        import onnx

        from onnxcast.base.contract import signature

        assert inspect_model(tiny_onnx).signature == signature(onnx.load(tiny_onnx))

    def test_not_onnx(self, tmp_path):
        (tmp_path / "x.onnx").write_bytes(b"\x00garbage")
        with pytest.raises(VerificationError, match="x.onnx: not a readable ONNX model"):
            inspect_model(tmp_path / "x.onnx")


    def test_without_the_onnx_package_the_same_checks_run(self, tiny_onnx, tmp_path):
        """A light device install has onnxruntime but not onnx: the wire-format scan and an
        ORT session give the same signature, and still refuse external data."""
        import onnx

        code = ("import sys, json\nsys.modules['onnx'] = None\n"
                "from onnxcast.rollout.edge import inspect_model\n"
                "from onnxcast.base.errors import VerificationError\n"
                "try:\n    info = inspect_model(sys.argv[1])\n"
                "    print(json.dumps({'signature': info.signature, 'opset': info.opset, 'metadata': info.metadata}))\n"
                "except VerificationError as exc:\n    print('refused:', exc)\n")
        run = lambda path: subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,  # noqa: E731
                                          check=True).stdout
        light = json.loads(run(tiny_onnx))
        full = inspect_model(tiny_onnx)
        assert (light["signature"], light["opset"], light["metadata"]) == (full.signature, full.opset, full.metadata)
        proto = onnx.load(tiny_onnx)
        tensor = proto.graph.initializer[0]
        tensor.ClearField("raw_data")
        del tensor.float_data[:]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.external_data.add(key="location", value="/etc/passwd")
        onnx.save(proto, tmp_path / "evil.onnx")
        assert "references external data '/etc/passwd' (outside the model folder)" in run(tmp_path / "evil.onnx")
        (tmp_path / "junk.onnx").write_bytes(b"\xff\xff\xff")
        assert "not a readable ONNX model" in run(tmp_path / "junk.onnx")


class TestPredict:
    def test_equals_the_pipelines_forecast_for_the_same_window(self, store_uri, make_run, tmp_path, history_csv):
        from onnxcast.pipeline.sessions import onnx_predict, onnx_session

        report = make_run("a")
        promote(report, store_uri, "m", "edge")
        pull(store_uri, "m", "edge", tmp_path / "device")
        out = io.StringIO()
        predict(tmp_path / "device", history_csv, out=out)
        lines = out.getvalue().splitlines()
        assert lines[0] == "step,ds,forecast,version" and len(lines) == 5
        rows_out = [line.split(",") for line in lines[1:]]
        # The input's last time is 2026-01-01T15:00:00Z and the model's freq is "h".
        assert [r[1] for r in rows_out] == [f"2026-01-01T{h}:00:00Z" for h in (16, 17, 18, 19)]
        version = json.loads((tmp_path / "device/current/pulled.json").read_text())["version"]
        assert {r[3] for r in rows_out} == {version}
        printed = np.array([np.float32(r[2]) for r in rows_out])
        rows = np.genfromtxt(history_csv, delimiter=",", names=True, dtype=None, encoding=None)
        window = np.stack([rows["y"], rows["x1"]], axis=1)[-16:].astype(np.float32)
        # What the pipeline computes for this window with the promoted file (onnxcast.pipeline.validate).
        expected = onnx_predict(onnx_session(report.parent / "models/lstm/onnx/fp32-opt.onnx"), window[None])[0]
        assert np.array_equal(printed, expected)

    @pytest.mark.parametrize("content, message", [
        ("ds,y\n1,2\n", r"missing column\(s\) 'x1'; found 'ds', 'y'$"),
        ("y,x1\n" + "1,2\n" * 5, r"5 row\(s\), the model needs the last 16"),
        ("y,x1\n" + "1,2\n" * 15 + "1,abc\n", r"in.csv: column 'x1' has non-numeric value 'abc' at line 17$"),
        ("y,x1\n" + "1,2\n" * 15 + "nan,1\n", r"in.csv: column 'y' value 'nan' at line 17 is not finite$"),
    ])
    def test_bad_csv(self, tmp_path, make_run, content, message):
        promote(make_run("a"), str(tmp_path / "store"), "m", "edge")
        pull(str(tmp_path / "store"), "m", "edge", tmp_path / "device")
        (tmp_path / "in.csv").write_text(content)
        with pytest.raises(DataError, match=message):
            predict(tmp_path / "device", tmp_path / "in.csv", out=io.StringIO())

    def test_a_bad_value_outside_the_window_is_refused_too(self, tmp_path, make_run):
        """Every row is checked, as in a long table (issue 31): before, one series' reader looked
        only at its last ``lookback`` rows and forecast from this table."""
        promote(make_run("a"), str(tmp_path / "store"), "m", "edge")
        pull(str(tmp_path / "store"), "m", "edge", tmp_path / "device")
        (tmp_path / "in.csv").write_text("y,x1\n1,2\n1,abc\n" + "1,2\n" * 20)
        with pytest.raises(DataError, match=r"in.csv: column 'x1' has non-numeric value 'abc' at line 3$"):
            predict(tmp_path / "device", tmp_path / "in.csv", out=io.StringIO())

    def test_one_series_is_a_fleet_of_one(self, tmp_path, make_run, history_csv, caplog):
        """The same rows with a series column, shuffled: the same forecast, one block of rows."""
        promote(make_run("a"), str(tmp_path / "store"), "m", "edge")
        pull(str(tmp_path / "store"), "m", "edge", tmp_path / "device")
        rows = [line.split(",", 1)[1] for line in history_csv.read_text().splitlines()[1:]]
        timed = [f"2026-01-{1 + i // 24:02d}T{i % 24:02d}:00:00Z,{row}" for i, row in enumerate(rows)]
        (tmp_path / "plain.csv").write_text("ds,y,x1\n" + "\n".join(timed) + "\n")
        shuffled = [f"meter 1,{row}" for row in timed]
        np.random.default_rng(1).shuffle(shuffled)
        (tmp_path / "long.csv").write_text("id,ds,y,x1\n" + "\n".join(shuffled) + "\n")
        one, out = predict(tmp_path / "device", tmp_path / "plain.csv", out=io.StringIO()), io.StringIO()
        fleet = predict(tmp_path / "device", tmp_path / "long.csv", out=out, series_column="id")
        assert one.series == [""] and fleet.series == ["meter 1"] and fleet.padded == []
        assert np.array_equal(one.forecast, fleet.forecast) and one.forecast.shape == (1, 4)
        lines = out.getvalue().splitlines()
        assert lines[0] == "id,step,ds,forecast,version" and lines[1].startswith("meter 1,1,2026-01-02T16:00:00Z,")

    def test_nothing_installed(self, tmp_path, history_csv):
        with pytest.raises(ConfigError, match="no model installed; run 'onnxcast edge pull' first"):
            predict(tmp_path / "device", history_csv)

    def test_locally_corrupted_model_is_not_run(self, tmp_path, make_run, history_csv):
        promote(make_run("a"), str(tmp_path / "store"), "m", "edge")
        pull(str(tmp_path / "store"), "m", "edge", tmp_path / "device")
        model = tmp_path / "device/current/lstm-fp32-opt.onnx"
        model.write_bytes(model.read_bytes() + b"\0")
        with pytest.raises(VerificationError, match="sha256 does not match the pulled manifest"):
            predict(tmp_path / "device", history_csv)
        pull(str(tmp_path / "store"), "m", "edge", tmp_path / "device")  # a pull repairs it
        predict(tmp_path / "device", history_csv, out=io.StringIO())

    @pytest.mark.slow
    def test_edge_needs_neither_torch_nor_pandas(self, tmp_path, make_run, history_csv):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "edge")
        heavy = ("torch", "pandas", "mlflow", "onnx", "airflow", "great_expectations")
        code = ("import sys, io\n"
                f"for name in {heavy!r}:\n    sys.modules[name] = None  # not installed on a device\n"
                "from onnxcast.rollout.edge import pull, predict\n"
                f"pull({store!r}, 'm', 'edge', {str(tmp_path / 'device')!r})\n"
                f"predict({str(tmp_path / 'device')!r}, {str(history_csv)!r}, out=io.StringIO())\n"
                f"print(sorted(m for m in {heavy!r} if sys.modules.get(m) is not None))\n")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert result.stdout.strip() == "[]"


class TestWatchAndCli:
    def test_watch_follows_the_channel_and_survives_a_bad_version(self, store_uri, make_run, tmp_path):
        dest, lines = tmp_path / "device", []
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        steps = iter([
            lambda: promote(make_run("b"), store_uri, "m", "edge", version="2"),
            lambda: (promote(make_run("c"), store_uri, "m", "edge", version="3"),
                     _overwrite(store_uri, "m/versions/3/lstm-fp32-opt.onnx", lambda d: d + b"x")),
        ])
        failures = watch(store_uri, "m", "edge", dest, interval=0, max_polls=3, on_poll=lines.append,
                         sleep=lambda seconds: next(steps)())
        assert failures == 1
        assert lines[0] == "poll 1: installed version 1" and lines[1] == "poll 2: installed version 2"
        assert lines[2].startswith("poll 3: refused, keeping the current model: ")
        assert (dest / "current").readlink().as_posix() == "versions/2"

    def test_cli_pull_watch_and_predict(self, tmp_path, make_run, history_csv, capsys):
        store, dest = str(tmp_path / "store"), str(tmp_path / "device")
        promote(make_run("a"), store, "m", "edge", version="1")
        assert _cli("edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", dest) == 0
        assert "m channel edge: installed version 1" in capsys.readouterr().out
        assert _cli("edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", dest,
                    "--watch", "--interval", "0", "--max-polls", "2") == 0
        assert capsys.readouterr().out.splitlines() == ["poll 1: unchanged at version 1", "poll 2: unchanged at version 1"]
        assert _cli("edge", "predict", "--dir", dest, "--input", str(history_csv)) == 0
        assert capsys.readouterr().out.startswith("step,ds,forecast,version\n1,")
        _overwrite(store, "m/versions/1/lstm-fp32-opt.onnx", lambda d: d + b"x")
        promote(make_run("b"), store, "m", "edge", version="2")
        _overwrite(store, "m/versions/2/lstm-fp32-opt.onnx", lambda d: d + b"x")
        assert _cli("edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", dest,
                    "--watch", "--interval", "0", "--max-polls", "1") == 1
        capsys.readouterr()
        assert _cli("edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", dest) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.splitlines()) == 1 and "longer than its signed length" in err


def _cli(*argv: str) -> int:
    """The real entry point (the ``onnxcast`` console script calls ``cli.main``)."""
    return cli.main(list(argv))


def _overwrite(store_uri: str, key: str, change) -> None:
    """Change an object behind the store's back (an attacker or a broken copy)."""
    store = open_store(store_uri)
    if store_uri.startswith("s3://"):
        full = f"{store.prefix}/{key}"
        data = store.client.get_object(Bucket=store.bucket, Key=full)["Body"].read()
        store.client.put_object(Bucket=store.bucket, Key=full, Body=change(data))
    else:
        path = store.root / key
        path.write_bytes(change(path.read_bytes()))
