"""The rollout page's data (onnxcast.airflow.plugin.data) on a real rollout store made by the
real promote/rollback/refresh functions, signed with the session's release key, and a real
MLflow registry (SQLite) holding the tags parts A and B write. No Airflow here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from rollout_support import raw_get, raw_put

from onnxcast.airflow.plugin.data import Registry, gather, monitor_state, rollout_state
from onnxcast.rollout.promote import promote, refresh, rollback
from onnxcast.rollout.store import dump_json, open_store

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


@pytest.fixture
def registry(tmp_path):
    """A real MLflow registry (SQLite) with model m versions 1 and 2."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    client.create_registered_model("m")
    for _ in range(2):
        client.create_model_version("m", source=str(tmp_path / "artifacts"))
    return Registry(uri, "http://mlflow.example:5000"), client


@pytest.fixture
def store(tmp_path, make_run):
    """m: edge promoted to 1, then 2, rolled back to 1 (a hostile reason), refreshed; cloud at 2."""
    uri = str(tmp_path / "store")
    promote(make_run("a", mlflow_version="1"), uri, "m", ["edge", "cloud"], version="1", actor="alice",
            reason="first release")
    promote(make_run("b", mlflow_version="2"), uri, "m", ["edge", "cloud"], version="2", actor="bob",
            reason="alias edge set to v2 in the MLflow registry")
    rollback(uri, "m", "edge", actor="carol", reason=HOSTILE)
    refresh(uri, "m", "edge", actor="dave")
    return uri


def channels(data: dict) -> dict:
    [model] = data["models"]
    assert model["name"] == "m" and model["error"] is None
    return {c["channel"]: c for c in model["channels"]}


def test_channels_versions_history_and_device_check(store, registry, release_key):
    reg, client = registry
    client.set_model_version_tag("m", "1", "onnxcast.rollout.edge", json.dumps(
        {"state": "deployed", "at": "2026-12-01T10:00:00Z", "reason": "promoted by onnxcast_promote", "run_id": "r1"}))
    client.set_model_version_tag("m", "1", "onnxcast.monitor.edge", json.dumps(
        {"at": "2026-12-01T11:00:00Z", "mase": 1.31, "holdout_mase": 0.92, "holdout_ci": [0.8, 1.05],
         "p_value": 0.003, "degraded": True, "drift": ["x1"], "origins": 12, "run_id": "abc",
         "from": "2026-11-01", "to": "2026-11-30"}))
    data = gather(open_store(store), trust_file=str(release_key["root"]), registry=reg)
    found = channels(data)
    assert sorted(found) == ["cloud", "edge"]
    edge, cloud = found["edge"], found["cloud"]
    assert edge["device"]["accepted"] and cloud["device"]["accepted"], (edge["device"], cloud["device"])
    assert edge["pointer"]["version"] == "1" and cloud["pointer"]["version"] == "2"
    # a refresh re-signs without a history entry: it shows as the pointer's last move
    assert edge["pointer"]["verified"] and edge["pointer"]["action"] == "refresh"
    assert edge["pointer"]["updated_by"] == "dave"
    signed = json.loads(raw_get(store, "m/channels/edge.json"))["signed"]
    assert edge["pointer"]["counter"] == signed["counter"] and edge["pointer"]["expires"] == signed["expires"]
    assert edge["pointer"]["expired"] is False
    # newest first
    assert [(h["action"], h["version"], h["by"]) for h in edge["history"]] == [
        ("rollback", "1", "carol"), ("promote", "2", "bob"), ("promote", "1", "alice")]
    assert edge["history"][0]["reason"] == HOSTILE  # kept as text; the template escapes it
    assert edge["history"][0]["from_version"] == "2" and edge["history"][2]["reason"] == "first release"
    # the registry: the manifest's version, its link, parts A's and B's tags
    assert edge["registry"]["version"] == "1" and edge["registry"]["manifest_verified"]
    assert edge["registry"]["url"] == "http://mlflow.example:5000/#/models/m/versions/1"
    assert edge["registry"]["rollout"] == {"state": "deployed", "at": "2026-12-01T10:00:00Z",
                                           "reason": "promoted by onnxcast_promote", "run_id": "r1"}
    monitor = edge["registry"]["monitor"]
    assert monitor["mase"] == 1.31 and monitor["degraded"] is True and monitor["drift"] == ["x1"]
    assert cloud["registry"]["version"] == "2" and cloud["registry"]["monitor"] is None  # not monitored yet
    assert cloud["registry"]["rollout"] is None
    json.dumps(data)  # the JSON endpoint serves exactly this


def test_tampered_pointer_is_shown_refused(store, registry, release_key):
    """Whoever can write the store rewrites the edge pointer to version 2 without a key: the page
    shows the claim, marked unverified, and a device's refusal, and the other channel still verifies."""
    envelope = json.loads(raw_get(store, "m/channels/edge.json"))
    envelope["signed"]["version"] = "2"
    envelope["signed"]["history"].append({"action": "promote", "version": "2", "by": "mallory",
                                          "at": "2026-12-01T00:00:00Z", "reason": HOSTILE})
    raw_put(store, "m/channels/edge.json", dump_json(envelope))
    found = channels(gather(open_store(store), trust_file=str(release_key["root"]), registry=registry[0]))
    edge = found["edge"]
    assert edge["device"]["accepted"] is False
    assert "signed by 0 of the 1 release key(s)" in edge["device"]["reason"], edge["device"]
    assert edge["pointer"]["verified"] is False and edge["pointer"]["version"] == "2"
    assert edge["history"][0]["by"] == "mallory"
    assert edge["registry"]["manifest_verified"] is False
    assert found["cloud"]["device"]["accepted"] is True


def test_pointer_of_another_channel_is_refused(store, release_key):
    """A validly signed pointer copied to another channel (a mix-up or a replay across channels)."""
    raw_put(store, "m/channels/beta.json", raw_get(store, "m/channels/cloud.json"))
    beta = channels(gather(open_store(store), trust_file=str(release_key["root"]), registry=None))["beta"]
    assert beta["device"]["accepted"] is False
    assert "signed for 'm' channel 'cloud', not 'm' channel 'beta'" in beta["device"]["reason"], beta["device"]


def test_other_keys_and_broken_pointers(store, tmp_path):
    """A root devices do not hold refuses every pointer; garbage, a non-object and a huge pointer
    are refused one by one; nothing raises."""
    from onnxcast.rollout.signing import generate_key

    other = generate_key(tmp_path / "other")
    found = channels(gather(open_store(store), trust_file=str(other["root"]), registry=None))
    assert not found["edge"]["device"]["accepted"] and not found["cloud"]["device"]["accepted"]
    assert found["edge"]["pointer"]["version"] == "1"  # shown, as a claim
    assert found["edge"]["registry"]["error"] == "no MLflow registry configured"

    raw_put(store, "m/channels/edge.json", b"{not json")
    raw_put(store, "m/channels/cloud.json", b"[1, 2]")
    raw_put(store, "m/channels/big.json", b" " * ((1 << 20) + 10))
    raw_put(store, "m/channels/deep.json", b"[" * 100_000)
    data = gather(open_store(store), trust_file=None, registry=None)
    found = channels(data)
    assert sorted(found) == ["big", "cloud", "deep", "edge"]
    for name, entry in found.items():
        assert entry["device"]["accepted"] is False, name
        assert "not checked: no trust root" in entry["device"]["reason"] or "over the size" in entry["device"]["reason"]
    assert "longer than" in found["big"]["error"]
    assert "nested deeper" in found["deep"]["error"]
    assert found["cloud"]["pointer"]["version"] is None


def test_expired_pointer_is_refused(tmp_path, make_run, release_key):
    uri = str(tmp_path / "store")
    promote(make_run("a"), uri, "m", "edge", version="1", expires_days=1 / 86400)  # a second
    import time

    time.sleep(1.5)
    [edge] = channels(gather(open_store(uri), trust_file=str(release_key["root"]), registry=None)).values()
    assert edge["device"]["accepted"] is False and "expired at" in edge["device"]["reason"]
    assert edge["pointer"]["expired"] is True
    assert edge["registry"]["error"] == "the manifest names no registered MLflow version"


def test_names_planted_in_the_store_are_not_followed(tmp_path, make_run):
    """Entries that are not valid names, and symlinks, are not listed (no path from the store is followed)."""
    root = tmp_path / "store"
    promote(make_run("a"), str(root), "m", ["edge", "cloud"], version="1")
    (root / "..hidden").mkdir()
    (root / "m" / "channels" / "bad name.json").write_text("{}")
    outside = tmp_path / "outside"
    (outside / "channels").mkdir(parents=True)
    (root / "linked").symlink_to(outside)
    (root / "m" / "channels" / "link.json").symlink_to(root / "m" / "channels" / "edge.json")
    data = gather(open_store(str(root)), trust_file=None, registry=None)
    assert [m["name"] for m in data["models"]] == ["m"]
    assert sorted(channels(data)) == ["cloud", "edge"]


def test_s3_store(s3_bucket, make_run, release_key):
    """On S3 (moto over HTTP): models and channels listed, what is not a name skipped, the
    device check reads the pointer and manifest from the bucket."""
    uri = f"s3://{s3_bucket}/rollout"
    promote(make_run("a"), uri, "m", "edge", version="1")
    raw_put(uri, "bad name/channels/edge.json", b"{}")
    raw_put(uri, "m/channels/notes.txt", b"x")
    raw_put(uri, "m/channels/bad name.json", b"{}")
    data = gather(open_store(uri), trust_file=str(release_key["root"]), registry=None)
    assert [m["name"] for m in data["models"]] == ["m"]
    [edge] = channels(data).values()
    assert edge["channel"] == "edge" and edge["device"]["accepted"], edge["device"]
    assert edge["pointer"]["version"] == "1" and edge["history"][0]["action"] == "promote"


def test_invalid_names_at_the_top_of_an_s3_store_hide_no_model(s3_bucket, make_run, release_key):
    """Issue 30, item 14: 150 folders whose names sort first and are no model names took the
    101 places of a listing filtered afterwards: the page showed no model, ``truncated: false``."""
    uri = f"s3://{s3_bucket}/rollout"
    promote(make_run("a"), uri, "m", "edge", version="1")
    store = open_store(uri)
    for i in range(150):  # one client: a client per object costs a second of CPU per ten
        store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/#bad-{i:03d}/x", Body=b"x")
    data = gather(store, trust_file=str(release_key["root"]), registry=None)
    assert [m["name"] for m in data["models"]] == ["m"] and data["truncated"] is False
    assert data["listing"] == {"read": 151, "skipped": 150, "truncated_because": None}
    assert channels(data)["edge"]["device"]["accepted"]
    # a folder of more entries than a listing reads: what was read is shown, and it says so
    listing = store.list_models(100, bound=120)
    assert listing.truncated and listing.stopped_at == 120 and listing.names == [] and listing.skipped == 120
    # S3 lists in order: once one valid name more than asked for is read, the rest is not listed
    listing = store.list_models(0)
    assert listing.names == [] and listing.truncated and listing.read == 151 and listing.stopped_at is None


def test_listing_of_a_local_store_is_filtered_bounded_and_honest(tmp_path, make_run):
    root = tmp_path / "store"
    promote(make_run("a"), str(root), "m", ["edge", "cloud"], version="1")
    for i in range(150):
        (root / f"#bad-{i:03d}").mkdir()
    for i in range(25):
        (root / "m" / "channels" / f"#bad-{i:03d}.json").write_text("{}")
    data = gather(open_store(str(root)), trust_file=None, registry=None)
    assert [m["name"] for m in data["models"]] == ["m"] and data["truncated"] is False
    assert data["listing"]["skipped"] == 150  # root/ and _model_repository/ are onnxcast's own, not skipped
    [model] = data["models"]
    assert sorted(c["channel"] for c in model["channels"]) == ["cloud", "edge"]
    assert model["channels_truncated"] is False and model["channel_listing"]["skipped"] == 25
    for i in range(100):
        (root / f"z{i:03d}").mkdir()
    data = gather(open_store(str(root)), trust_file=None, registry=None)
    names = [m["name"] for m in data["models"]]
    assert len(names) == 100 and names == sorted(names) and names[0] == "m" and data["truncated"] is True
    listing = open_store(str(root)).list_models(1000, bound=200)
    assert listing.truncated and listing.stopped_at == 200 and listing.read == 200


def test_missing_store_and_registry_failures(tmp_path, store):
    data = gather(open_store(str(tmp_path / "nothing")), trust_file=None, registry=None)
    assert data["models"] == [] and data["error"] is None
    down = Registry("http://127.0.0.1:9/", None)  # nothing listens on the discard port
    import os

    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    edge = channels(gather(open_store(store), trust_file=None, registry=down))["edge"]
    assert edge["registry"]["version"] == "1"
    assert edge["registry"]["error"].startswith("the MLflow registry could not be read"), edge["registry"]


def test_mlflow_link_never_carries_a_login():
    assert Registry("https://pipeline:s3cret@mlflow.example:8443/base", None).version_url("m", "3") == \
        "https://mlflow.example:8443/base/#/models/m/versions/3"
    assert Registry("sqlite:///x.db", None).version_url("m", "3").endswith("/#/models/m/versions/3")


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("not json", "unreadable"),
    ('{"state": "deployed"}', "deployed"),
    ('{"state": "<b>owned</b>"}', "unknown"),
    ('[1]', "unreadable"),
])
def test_rollout_tag(value, expected):
    state = rollout_state(value)
    assert (state if state is None else state["state"]) == expected


def test_monitor_tag_keeps_known_fields_of_known_types():
    shown = monitor_state(json.dumps({"mase": "1; DROP", "holdout_ci": [0.1, "x"], "drift": ["a\u202eb", 3],
                                      "degraded": "yes", "origins": 2.5, "extra": "ignored"}))
    assert shown["mase"] is None and shown["holdout_ci"] == [0.1, None] and shown["degraded"] is None
    assert shown["drift"] == ["a b", "3"] and shown["origins"] is None and "extra" not in shown
    assert monitor_state("[" * 1000)["unreadable"]


def test_page_escapes_hostile_text(store, registry, release_key):
    """The HTML page (jinja2 autoescape): a hostile rollback reason is text, never markup."""
    import jinja2

    from onnxcast.airflow.plugin.app import TEMPLATES

    reg, client = registry
    client.set_model_version_tag("m", "1", "onnxcast.rollout.edge", json.dumps(
        {"state": "refused", "reason": HOSTILE, "at": "2026-12-01T10:00:00Z"}))
    data = gather(open_store(store), trust_file=str(release_key["root"]), registry=reg)
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                                     undefined=jinja2.StrictUndefined)
    html = environment.get_template("rollout.html").render(data=data)
    assert "<script>" not in html and "<img" not in html
    assert html.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;") == 2  # the history and the rollout tag
    assert "not monitored yet" in html and "accepted" in html


def test_plugin_module_is_import_light():
    """Airflow imports plugins in every component: the plugin module loads no FastAPI app,
    FastAPI, MLflow or rollout code until the API server asks for its apps."""
    code = ("import sys, onnxcast.airflow.plugin as p; "
            "heavy = {'mlflow', 'fastapi', 'onnxcast.airflow.plugin.app', 'onnxcast.airflow.plugin.data', 'onnxcast.rollout.edge', 'numpy', 'tuf'} & set(sys.modules); "
            "assert not heavy, heavy; "
            "assert p.OnnxcastPlugin.external_views[0]['href'] == '/onnxcast/rollout'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unexpected_exception_is_one_refused_channel(store, release_key, monkeypatch):
    from onnxcast.rollout.trust import DeviceTrust

    def crash(*args, **kwargs):
        raise KeyError("keyid")

    monkeypatch.setattr(DeviceTrust, "verify_pointer", crash)
    found = channels(gather(open_store(store), trust_file=str(release_key["root"]), registry=None))
    for entry in found.values():
        assert entry["device"]["accepted"] is False
        assert "not checked (internal error KeyError)" in entry["device"]["reason"]
        assert entry["pointer"]["verified"] is False
