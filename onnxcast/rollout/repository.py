"""Publish a channel's model in the Triton / KServe model repository layout, in the store.

So that a team running Triton (or KServe with the Triton runtime) can point it at the bucket
and follow the channel without onnxcast::

    <store>/_model_repository/<channel>/<model>/config.pbtxt        dynamic batching, I/O dims
                                                                     (forecast, and quantiles if the model has it)
    <store>/_model_repository/<channel>/<model>/<n>/model.onnx      written once
    <store>/_model_repository/<channel>/<model>/onnxcast.json       n -> onnxcast version

Triton model versions must be positive integers: ``n`` is the number of moves in the channel
pointer's history, so every promotion and every rollback is a new, higher number, and
``version_policy: latest 1`` serves what the channel points to. The bytes published are those
:func:`onnxcast.rollout.edge.pull` verified (the device checks, signatures included where the store
has them), never read from the bucket unchecked. ``_`` cannot start a model name, so the
folder cannot collide with a model's.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass

from onnxcast.base.errors import ConflictError, StoreError, VerificationError
from onnxcast.rollout.store import (
    MODEL_REPOSITORY_FOLDER,
    RolloutStore,
    S3Store,
    check_name,
    dump_json,
    open_store,
)

log = logging.getLogger(__name__)
REPOSITORY = MODEL_REPOSITORY_FOLDER  # "_model_repository", listed apart by the store
PUBLISHED_CHANNELS = ("cloud",)  # promote/rollback publish these; 'edge' devices pull instead


@dataclass(frozen=True)
class RepositoryResult:
    model: str
    channel: str
    version: str
    number: int  # the Triton version directory
    changed: bool
    url: str


def publish_model_repository(store: RolloutStore | str, model: str, channel: str = "cloud", *,
                             max_batch_size: int = 64, max_queue_delay_us: int = 5000,
                             trust=None) -> RepositoryResult:
    """Publish the model ``channel`` points to as the next Triton version (idempotent).
    ``trust``: the trust root the pull verifies with (a file, or a root held in memory;
    default ``$ONNXCAST_TRUST``)."""
    from onnxcast.rollout.edge import inspect_model, installed_model, pull

    store = store if isinstance(store, RolloutStore) else open_store(store)
    check_name("model", model)
    check_name("channel", channel)
    pointer = store.read_channel(model, channel)
    if pointer.value is None:
        raise StoreError(f"{store.url(store.channel_key(model, channel))}: no such channel for model {model!r}")
    number = max(1, len(pointer.value.get("history", [])))
    s3_settings = store.settings if isinstance(store, S3Store) else None
    # The pull verifies into a scratch device folder removed at the end: its name says so,
    # since the pull logs where it "installed" the model (it was read as the repository's place).
    with tempfile.TemporaryDirectory(prefix="onnxcast-temporary-verify-") as device:
        pulled = pull(store.uri, model, channel, device, trust=trust, s3_settings=s3_settings, channel_artifact=True)
        if pulled.version != pointer.value.get("version"):
            raise ConflictError(f"{store.url(store.channel_key(model, channel))} moved while publishing the model "
                                "repository; re-run")
        path = installed_model(device)
        data = path.read_bytes()
        info = inspect_model(path)
    base = f"{REPOSITORY}/{channel}/{model}"
    model_key = f"{base}/{number}/model.onnx"
    changed = store.create(model_key, data)
    if not changed and store.read(model_key) != data:
        raise VerificationError(f"{store.url(model_key)}: holds other bytes than version {pulled.version} of "
                                f"channel {channel!r}; refusing to overwrite a published Triton version")
    config = triton_config(model, info.signature, max_batch_size, max_queue_delay_us)
    store.put(f"{base}/config.pbtxt", config.encode())
    index_key = f"{base}/onnxcast.json"
    index = json.loads(store.read(index_key) or b"{}")
    index[str(number)] = {"version": pulled.version, "sha256": pointer.value.get("sha256"),
                          "artifact": pointer.value.get("artifact"), "at": pointer.value.get("updated_at")}
    store.put(index_key, dump_json(index))
    log.info("model repository: %s version %s (channel %s) is Triton version %d at %s", model, pulled.version,
             channel, number, store.url(base))
    return RepositoryResult(model, channel, pulled.version, number, changed, store.url(base))


def triton_config(model: str, signature: dict, max_batch_size: int = 64, max_queue_delay_us: int = 5000) -> str:
    """A Triton ``config.pbtxt`` for an onnxcast model: batch is Triton's, time is dynamic;
    a model with the ``quantiles`` output declares it too (dims ``[horizon, Q]``)."""
    (history,), outputs = signature["inputs"], signature["outputs"]
    n_features = history["shape"][2]
    declared = ", ".join(f'{{ name: "{o["name"]}" data_type: TYPE_FP32 dims: [ '
                         f'{", ".join(str(_dim(d)) for d in o["shape"][1:])} ] }}' for o in outputs)
    return "\n".join([
        f'name: "{model}"',
        'platform: "onnxruntime_onnx"',
        'backend: "onnxruntime"',
        f"max_batch_size: {max_batch_size}",
        "version_policy: { latest: { num_versions: 1 } }",
        f'input [ {{ name: "{history["name"]}" data_type: TYPE_FP32 dims: [ -1, {_dim(n_features)} ] }} ]',
        f"output [ {declared} ]",
        f"dynamic_batching {{ max_queue_delay_microseconds: {max_queue_delay_us} }}",
        'instance_group [ { kind: KIND_CPU count: 1 } ]',
        "",
    ])


def _dim(value) -> int:
    return value if isinstance(value, int) else -1
