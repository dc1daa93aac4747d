"""The run store: stage committed files, publish with a commit marker, never read half a step.

Local folders, S3 over real HTTP (moto's server; SeaweedFS in tests/stack), and an fsspec
URL through Airflow's ObjectStoragePath."""

from __future__ import annotations

import json
import socket

import pytest

from onnxcast.runstore import (
    IncompleteRunError,
    LocalBackend,
    RunDir,
    RunStore,
    RunStoreError,
    S3Backend,
    backend_for,
)


def write(folder, relative: str, text: str) -> None:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def local_run(tmp_path) -> RunDir:
    url = RunStore(str(tmp_path / "runs")).run_url("dag", "manual__2026-11-30T00:00:00+00:00")
    return RunDir(url, backend_for(url))


def test_run_urls_are_one_segment_per_id(tmp_path):
    store = RunStore(str(tmp_path))
    assert store.run_url("dag", "manual__2026-11-30T00:00:00+00:00").endswith("/dag/manual__2026-11-30T00_00_00_00_00")
    assert RunStore("s3://bucket/runs/").run_url("d", "r") == "s3://bucket/runs/d/r"


def test_a_step_publishes_what_it_changed_and_the_next_stages_it(tmp_path):
    run = local_run(tmp_path)
    first = tmp_path / "first"
    write(first, "config.json", "{}")
    write(first, "data/series.json", "[1, 2]")
    marker = run.publish("check_data", first)
    assert set(marker["files"]) == {"config.json", "data/series.json"}

    second = tmp_path / "second"
    staged = run.stage(second, require=["check_data"])
    assert (second / "data" / "series.json").read_text() == "[1, 2]"
    write(second, "models/lstm/model.pt", "weights")
    marker = run.publish("train_or_fetch.lstm", second, staged)
    assert set(marker["files"]) == {"models/lstm/model.pt"}  # unchanged inputs are not uploaded again
    assert [m["step"] for m in run.markers()] == ["check_data", "train_or_fetch.lstm"]


def test_stage_keeps_only_the_families_asked_for(tmp_path):
    run = local_run(tmp_path)
    source = tmp_path / "source"
    for family in ("lstm", "nhits"):
        write(source, f"models/{family}/model.pt", family)
    write(source, "config.json", "{}")
    run.publish("fixture", source)
    target = tmp_path / "target"
    run.stage(target, families=["nhits"])
    assert (target / "config.json").exists() and (target / "models/nhits/model.pt").exists()
    assert not (target / "models/lstm").exists()


def test_a_shard_task_stages_only_its_own_shard(tmp_path):
    """Fleet runs (design 5.3): the prefixes are whole segments, so shard 001 does not pull
    shard 010's files, nor a file whose name merely starts like a folder asked for."""
    run = local_run(tmp_path)
    source = tmp_path / "source"
    for relative in ("config.json", "data/shards.json", "data/shards/001/rows.parquet",
                     "data/shards/010/rows.parquet", "data/shards/002/rows.parquet",
                     "data/reference/shards/001.parquet", "data/reference/shards/002.parquet",
                     "models/nhits/onnx/fp32.onnx", "models/nhits/model.pt", "models/lstm/onnx/int8.onnx"):
        write(source, relative, relative)
    run.publish("fixture", source)
    target = tmp_path / "target"
    staged = run.stage(target, paths=["config.json", "data/shards.json", "data/shards/001",
                                      "data/reference/shards/001.parquet", "models/*/onnx/"])
    assert sorted(staged.files) == ["config.json", "data/reference/shards/001.parquet", "data/shards.json",
                                    "data/shards/001/rows.parquet", "models/lstm/onnx/int8.onnx",
                                    "models/nhits/onnx/fp32.onnx"]
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == sorted(staged.files)
    assert run.stage(tmp_path / "all").files.keys() == run.stage(tmp_path / "none", paths=None).files.keys()


@pytest.mark.parametrize("bad", ["", "/", "/etc", "../other", "data/../../x"])
def test_a_stage_prefix_outside_the_run_is_refused(tmp_path, bad):
    with pytest.raises(RunStoreError, match="not a relative path inside the run directory"):
        local_run(tmp_path).stage(tmp_path / "target", paths=[bad])


def test_files_without_a_commit_marker_are_never_read(tmp_path):
    """A try that died after uploading some files but before its marker: nothing of it counts."""
    run = local_run(tmp_path)
    run.backend.write("models/lstm/model.pt", b"half of a try")
    target = tmp_path / "target"
    assert run.stage(target).files == {}
    assert not (target / "models").exists()
    with pytest.raises(IncompleteRunError, match=r"step\(s\) train_or_fetch.lstm have not committed"):
        run.stage(tmp_path / "again", require=["train_or_fetch.lstm"])


def test_a_file_that_differs_from_its_marker_is_refused_naming_it(tmp_path):
    run = local_run(tmp_path)
    source = tmp_path / "source"
    write(source, "models/lstm/onnx/fp32.onnx", "model bytes")
    run.publish("export.lstm", source)
    run.backend.write("models/lstm/onnx/fp32.onnx", b"a retry half-way through rewriting it")
    with pytest.raises(IncompleteRunError, match=r"models/lstm/onnx/fp32.onnx: sha256 \w+ differs .* 'export.lstm'"):
        run.stage(tmp_path / "target")


def test_a_listed_file_missing_from_the_store_is_named(tmp_path):
    run = local_run(tmp_path)
    source = tmp_path / "source"
    write(source, "report.json", "{}")
    run.publish("register", source)
    (tmp_path / "runs" / "dag").joinpath(run.url.rsplit("/", 1)[1], "report.json").unlink()
    with pytest.raises(IncompleteRunError, match=r"report.json: listed by step 'register' but absent"):
        run.stage(tmp_path / "target")


@pytest.mark.parametrize("bad", ["../outside.txt", "/etc/passwd", "models/../../x"])
def test_a_marker_cannot_write_outside_the_scratch_folder(tmp_path, bad):
    """Markers are read from a shared bucket: a path in one is input, confined like any other."""
    run = local_run(tmp_path)
    marker = {"version": 1, "step": "evil", "files": {bad: {"sha256": "0" * 64, "size": 1}}, "committed": "x"}
    run.backend.write("_steps/evil.json", json.dumps(marker).encode())
    with pytest.raises(RunStoreError, match="path"):
        run.stage(tmp_path / "target")
    assert not (tmp_path / "outside.txt").exists()


def test_a_marker_that_is_not_json_is_named(tmp_path):
    run = local_run(tmp_path)
    run.backend.write("_steps/broken.json", b"{not json")
    with pytest.raises(IncompleteRunError, match=r"_steps/broken.json: commit marker is not JSON"):
        run.stage(tmp_path / "target")


def test_step_names_are_checked(tmp_path):
    with pytest.raises(RunStoreError, match="step name"):
        local_run(tmp_path).publish("../x", tmp_path)


def test_local_backend_refuses_keys_outside_its_root(tmp_path):
    backend = LocalBackend(tmp_path / "root")
    with pytest.raises(RunStoreError, match="outside"):
        backend.write("../escape", b"x")


def test_s3_run_store_over_http(s3_bucket, tmp_path):
    """The same run on S3 (moto's server over HTTP): publish, stage, and the layout in the bucket."""
    import boto3

    url = RunStore(f"s3://{s3_bucket}/runs").run_url("dag", "run-1")
    run = RunDir(url, backend_for(url))
    source = tmp_path / "source"
    write(source, "config.json", '{"horizon": 12}')
    write(source, "models/lstm/model.pt", "weights")
    run.publish("check_data", source)
    keys = sorted(o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert keys == ["runs/dag/run-1/_steps/check_data.json", "runs/dag/run-1/config.json",
                    "runs/dag/run-1/models/lstm/model.pt"]
    staged = run.stage(tmp_path / "target", families=["lstm"])
    assert set(staged.files) == {"config.json", "models/lstm/model.pt"}
    with pytest.raises(IncompleteRunError):
        RunDir(url, backend_for(url)).stage(tmp_path / "t2", require=["register"])


def test_s3_unreachable_during_upload_leaves_no_commit_and_the_retry_completes(s3_bucket, tmp_path):
    """S3 goes away half-way through a publish: the step is not committed (nothing of it is
    staged), the error names the object, and publishing again once S3 is back commits it."""
    from onnxcast.base.s3 import S3Settings, make_client

    good = make_client()
    with socket.socket() as sock:  # a port nothing listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        dead_port = sock.getsockname()[1]
    dead = make_client(S3Settings(endpoint_url=f"http://127.0.0.1:{dead_port}", region_name="us-east-1",
                                  aws_access_key_id="x", aws_secret_access_key="y", max_attempts=1,
                                  connect_timeout=1))

    class FailsAfterOne:
        """Writes the first object, then S3 is unreachable."""

        def __init__(self):
            self.calls = 0

        def put_object(self, **kwargs):
            self.calls += 1
            return (good if self.calls == 1 else dead).put_object(**kwargs)

    source = tmp_path / "source"
    for name in ("a.json", "b.json", "c.json"):
        write(source, f"data/{name}", name)
    broken = RunDir(f"s3://{s3_bucket}/runs/d/r", S3Backend(s3_bucket, "runs/d/r", FailsAfterOne()))
    with pytest.raises(RunStoreError, match=rf"s3://{s3_bucket}/runs/d/r/data/b.json: cannot write"):
        broken.publish("check_data", source)
    run = RunDir(f"s3://{s3_bucket}/runs/d/r", S3Backend(s3_bucket, "runs/d/r", good))
    assert run.markers() == [] and run.stage(tmp_path / "before").files == {}
    run.publish("check_data", source)  # the retry
    assert set(run.stage(tmp_path / "after").files) == {"data/a.json", "data/b.json", "data/c.json"}


def test_other_urls_go_through_object_storage_path(tmp_path):
    """URLs of filesystems an Airflow provider registers (gs://, abfs://, ...) go through
    ObjectStoragePath; its built-in file:// filesystem stands in for them here."""
    from onnxcast.airflow.runstore import object_storage_backend

    url = f"file://{tmp_path}/store/dag/run"
    run = RunDir(url, object_storage_backend(url))
    source = tmp_path / "source"
    write(source, "config.json", "{}")
    write(source, "models/dlinear/model.json", "{}")
    run.publish("check_data", source)
    assert (tmp_path / "store/dag/run/_steps/check_data.json").exists()
    staged = run.stage(tmp_path / "target")
    assert set(staged.files) == {"config.json", "models/dlinear/model.json"}
    with pytest.raises(RunStoreError, match="nosuch://bucket/runs: .*'nosuch'; use s3://"):
        object_storage_backend("nosuch://bucket/runs")
    with pytest.raises(RunStoreError, match="nosuch://bucket/runs: .*'nosuch' outside Airflow; use s3://"):
        backend_for("nosuch://bucket/runs")
