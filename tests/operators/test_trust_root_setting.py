"""One development fallback for the trust root of the provider's verified pulls (the monitor and
the rollout page; issue 31 found it written twice, the two disagreeing on a named store)."""

from __future__ import annotations

import pytest


@pytest.fixture
def keys_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ONNXCAST_MODE", "embedded")
    for name in ("ONNXCAST_TRUST", "ONNXCAST_STORE_URI"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "root.json").write_text("{}")
    return tmp_path


def test_given_then_the_environment_then_the_development_root(keys_dir, monkeypatch):
    from onnxcast.airflow.settings import trust_root

    assert trust_root(None, keys_dir) == str(keys_dir / "root.json")
    monkeypatch.setenv("ONNXCAST_TRUST", "/etc/onnxcast/root.json")
    assert trust_root("None", keys_dir) == "/etc/onnxcast/root.json"  # an unset templated param
    assert trust_root("/given/root.json", keys_dir) == "/given/root.json"


def test_no_development_root_once_a_store_is_named_or_deployed(keys_dir, monkeypatch):
    """A named store is signed with a configured key, never the development one: its root would
    only make the check refuse."""
    from onnxcast.airflow.settings import trust_root

    assert trust_root(None, keys_dir, "s3://bucket-a/store") is None
    monkeypatch.setenv("ONNXCAST_STORE_URI", "s3://bucket-a/store")
    assert trust_root(None, keys_dir) is None
    monkeypatch.delenv("ONNXCAST_STORE_URI")
    monkeypatch.setenv("ONNXCAST_MODE", "deployed")
    assert trust_root(None, keys_dir) is None
    (keys_dir / "root.json").unlink()
    monkeypatch.setenv("ONNXCAST_MODE", "embedded")
    assert trust_root(None, keys_dir) is None
