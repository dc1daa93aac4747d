"""The cloud channel is also a Triton / KServe model repository in the store: one numbered
version per channel move, config.pbtxt with dynamic batching and the model's dims."""

from __future__ import annotations

import json

import pytest

from onnxcast.base.errors import VerificationError
from onnxcast.rollout.promote import promote, rollback
from onnxcast.rollout.repository import publish_model_repository
from onnxcast.rollout.store import open_store


def test_promotions_and_rollbacks_become_numbered_triton_versions(store_uri, make_run):
    store = open_store(store_uri)
    promote(make_run("a"), store_uri, "m", ["edge", "cloud"], version="1")
    promote(make_run("b"), store_uri, "m", "cloud", version="2")
    rollback(store_uri, "m", "cloud", reason="test")
    base = "_model_repository/cloud/m"
    for number, version in (("1", "1"), ("2", "2"), ("3", "1")):  # a rollback is a new, higher number
        assert store.read(f"{base}/{number}/model.onnx") == store.read(f"m/versions/{version}/lstm-fp32.onnx")
    index = json.loads(store.read(f"{base}/onnxcast.json"))
    assert {n: e["version"] for n, e in index.items()} == {"1": "1", "2": "2", "3": "1"}
    config = store.read(f"{base}/config.pbtxt").decode()
    for line in ('name: "m"', 'platform: "onnxruntime_onnx"', "max_batch_size: 64",
                 "version_policy: { latest: { num_versions: 1 } }",
                 'input [ { name: "history" data_type: TYPE_FP32 dims: [ -1, 2 ] } ]',
                 'output [ { name: "forecast" data_type: TYPE_FP32 dims: [ 4 ] } ]',
                 "dynamic_batching { max_queue_delay_microseconds: 5000 }"):
        assert line in config.splitlines()
    assert store.read("_model_repository/edge/m/config.pbtxt") is None  # devices pull the edge channel


def test_republishing_is_a_no_op(tmp_path, make_run):
    store = str(tmp_path / "store")
    promote(make_run("a"), store, "m", "cloud", version="1")
    again = publish_model_repository(store, "m", "cloud")
    assert (again.number, again.version, again.changed) == (1, "1", False)


def test_a_tampered_artifact_is_not_published(tmp_path, make_run):
    store = tmp_path / "store"
    promote(make_run("a"), str(store), "m", "cloud", version="1")
    artifact = store / "m/versions/1/lstm-fp32.onnx"
    artifact.write_bytes(artifact.read_bytes()[:-1] + b"x")
    (store / "_model_repository/cloud/m/1/model.onnx").unlink()
    with pytest.raises(VerificationError, match="refusing version 1"):
        publish_model_repository(str(store), "m", "cloud")
    assert not (store / "_model_repository/cloud/m/1/model.onnx").exists()


def test_published_model_runs_with_onnxruntime_at_tritons_batch_sizes(tmp_path, make_run):
    import numpy as np
    import onnxruntime as ort

    store = tmp_path / "store"
    promote(make_run("a"), str(store), "m", "cloud", version="1")
    session = ort.InferenceSession(str(store / "_model_repository/cloud/m/1/model.onnx"),
                                   providers=["CPUExecutionProvider"])
    for batch in (1, 64):
        assert session.run(["forecast"], {"history": np.ones((batch, 16, 2), np.float32)})[0].shape == (batch, 4)


def test_promote_names_the_repository_and_calls_the_verify_folder_temporary(tmp_path, make_run):
    """The pull that verifies the bytes before publishing logs where it installed them: a
    scratch folder, removed at once, which read as the Triton repository's location."""
    import os
    import re
    import subprocess
    import sys

    from serve_support import REPO

    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "onnxcast", "promote", "--report", str(make_run("a")), "--store",
                           str(store), "--model", "m", "--channel", "cloud", "--version", "1"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"model repository: m version 1 (channel cloud) is Triton version 1 at {store}/_model_repository/cloud/m" \
        in done.stderr
    scratch = re.findall(r"(/\S*onnxcast-\S*?)(?:/|\s)", done.stderr)
    assert scratch and all("temporary" in folder for folder in scratch), done.stderr
    assert not any(os.path.exists(folder) for folder in scratch)  # removed once published


def _model_config(text: str):
    """config.pbtxt parsed as Triton's own ModelConfig message: what Triton reads at load."""
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.mark.parametrize("quantiles", [True, False], ids=["with-quantiles", "forecast-only"])
def test_config_declares_every_output_of_the_model_as_triton_parses_it(tmp_path, make_run, quantiles):
    import numpy as np
    import onnxruntime as ort

    store = tmp_path / "store"
    promote(make_run("a", quantiles=quantiles), str(store), "m", "cloud", version="1")
    config = _model_config((store / "_model_repository/cloud/m/config.pbtxt").read_text())
    fp32 = pytest.importorskip("tritonclient.grpc.model_config_pb2").TYPE_FP32
    assert config.input[0].data_type == fp32
    assert [(i.name, list(i.dims)) for i in config.input] == [("history", [-1, 2])]
    want = [("forecast", [4])] + ([("quantiles", [4, 5])] if quantiles else [])
    assert [(o.name, list(o.dims)) for o in config.output] == want
    assert {o.data_type for o in config.output} == {fp32} and config.max_batch_size == 64
    # what Triton would run: the published file gives exactly those outputs, at its batch sizes
    session = ort.InferenceSession(str(store / "_model_repository/cloud/m/1/model.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == [name for name, _ in want]
    for batch in (1, 64):
        results = session.run(None, {"history": np.ones((batch, 16, 2), np.float32)})
        assert [r.shape for r in results] == [(batch, *dims) for _, dims in want]
