"""Helpers of the rollout tests: write and read a store behind its back (as anyone with write
access to the bucket can), and the one-line error every refusal must be."""

from __future__ import annotations

import json
from types import SimpleNamespace

from onnxcast.rollout.store import open_store


def raw_get(store_uri: str, key: str) -> bytes:
    store = open_store(store_uri)
    if store_uri.startswith("s3://"):
        return store.client.get_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}")["Body"].read()
    return (store.root / key).read_bytes()


def raw_put(store_uri: str, key: str, data: bytes) -> None:
    """Write behind the store's back, as anyone with write access to the bucket can."""
    store = open_store(store_uri)
    if store_uri.startswith("s3://"):
        store.client.put_object(Bucket=store.bucket, Key=f"{store.prefix}/{key}", Body=data)
    else:
        path = store.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def one_error_line(capsys, contains: str) -> str:
    """stderr is one ``error:`` line containing ``contains``, without a traceback."""
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert contains in err, err
    return err


class RecordingRegistry:
    """The MLflow registry calls a rollout report makes: version tags written and aliases moved,
    recorded (in place of MLflow's client)."""

    def __init__(self, aliases: dict) -> None:
        self.aliases, self.tags = dict(aliases), {}

    def set_model_version_tag(self, name, version, key, value):
        self.tags[(str(version), key)] = json.loads(value)

    def get_registered_model(self, name):
        return SimpleNamespace(aliases=dict(self.aliases))

    def set_registered_model_alias(self, name, alias, version):
        self.aliases[alias] = str(version)

    def delete_registered_model_alias(self, name, alias):
        self.aliases.pop(alias)
