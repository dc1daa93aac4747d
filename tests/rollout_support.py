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


def publish_with_targets(store_uri: str, model: str, channel: str, targets: dict[str, str], *, version: str,
                         evidence: dict[str, dict[str, str]] | None = None) -> dict:
    """Publish the version ``channel`` serves again as ``version``, its manifest carrying the fields
    of deployment targets (issue 33, as onnxcast.rollout.promote writes them): the channel's
    ``targets`` ``{target: {"artifact", "family", "variant"}}`` from ``targets`` (target -> artifact
    name, listed as validated), each artifact's ``targets`` ``{target: {"status", "evidence"}}`` from
    ``evidence`` (artifact -> {target: status}; default: validated for each listed pair), signed
    with the release key; the channel's pointer moves to it. Returns the manifest."""
    from onnxcast.base.files import sha256_bytes
    from onnxcast.rollout.signing import load_signers, sign_envelope
    from onnxcast.rollout.store import dump_json

    store = open_store(store_uri)
    pointer = store.read_channel(model, channel)
    old = pointer.value["version"]
    manifest = store.read_manifest(model, old)
    manifest["version"] = version
    artifacts = manifest["artifacts"]
    choice = manifest["channels"][channel]
    choice["targets"] = {name: {"artifact": artifact, "family": artifacts[artifact]["family"],
                                "variant": artifacts[artifact]["variant"]} for name, artifact in targets.items()}
    if evidence is None:
        evidence = {}
        for name, artifact in targets.items():
            evidence.setdefault(artifact, {})[name] = "validated"
    for artifact, statuses in evidence.items():
        artifacts[artifact]["targets"] = {name: {"status": status, "evidence": {"note": "written by a test"}}
                                          for name, status in statuses.items()}
    for name in artifacts:
        store.create(store.version_key(model, version, name), store.read(store.version_key(model, old, name)))
    signers = load_signers()
    manifest_bytes = dump_json(sign_envelope(manifest, signers))
    store.create(store.version_key(model, version), manifest_bytes)
    entry = artifacts[choice["artifact"]]
    store.replace_pointer(store.channel_key(model, channel), sign_envelope({
        **pointer.value, "version": version, "sha256": entry["sha256"], "length": entry["size_bytes"],
        "counter": pointer.value["counter"] + 1,
        "manifest": {"sha256": sha256_bytes(manifest_bytes), "length": len(manifest_bytes)}}, signers), pointer.token)
    return manifest


def random_forecaster(path, seed: int = 0):
    """``tiny_onnx``'s contract (an LSTM on target y and feature x1, lookback 16, horizon 4, five
    quantile levels) with random weights, exported to ``path``: an untrained model's zero head
    forecasts a constant whatever its core computes, so a runtime's differences would not show."""
    import numpy as np
    import torch

    from onnxcast.base.contract import DEFAULT_QUANTILE_LEVELS, format_quantile_levels
    from onnxcast.pipeline.export import export_onnx
    from onnxcast.pipeline.models import ModelSpec, build_model

    torch.manual_seed(seed)
    spec = ModelSpec(family="lstm", n_features=2, horizon=4, lookback=16, hidden_size=8, num_layers=1, season=4,
                     quantile_levels=DEFAULT_QUANTILE_LEVELS)
    model = build_model(spec, np.array([100.0, 5.0]), np.array([10.0, 2.0]))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
        model.quantile_offsets.copy_(torch.sort(torch.randn(4, len(DEFAULT_QUANTILE_LEVELS)), dim=1).values)
    metadata = {"model_family": "lstm", "lookback": 16, "horizon": 4, "freq": "h", "target": "y", "features": "x1",
                "precision": "fp32", "trained_until": "2026-01-01T00:00:00Z", "dataset_sha256": "ab" * 32,
                "quantile_levels": format_quantile_levels(DEFAULT_QUANTILE_LEVELS)}
    return export_onnx(model.eval(), path, n_features=2, lookback=16, metadata=metadata)
