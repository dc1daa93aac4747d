"""What a device trusts, and the newest it has verified: ``DEST/trust/``.

- ``DEST/trust/root.json``: the trust root (TUF Root) the device checks everything with.
  Installed once (``onnxcast edge trust``, or the first pull with ``--trust FILE`` /
  ``$ONNXCAST_TRUST``); replaced only by the next root of the chain the store publishes
  (``root/<n+1>.root.json``, signed by a threshold of the old keys and of the new).
- ``DEST/trust/state.json``: per model and channel, the highest pointer ``counter`` the
  device verified, the version it serves and every version it verified, in order. A
  pointer with a lower counter is a replay; one that goes back to a version verified
  before needs a signed rollback record.

Nothing here trusts the store: the store only carries bytes; signatures, counters,
expiries and signed lengths decide.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError, RefusedError
from onnxcast.base.untrusted import UntrustedInputError, loads_json, quote, read_regular_file
from onnxcast.rollout.command import device_command
from onnxcast.rollout.device import DeviceFolder, open_device_folder
from onnxcast.rollout.signing import (
    MANIFEST_ROLE,
    MANIFEST_TYPE,
    POINTER_ROLE,
    POINTER_TYPE,
    TRUST_ENV,
    check_root_fresh,
    parse_root,
    parse_time,
    verify_envelope,
    verify_next_root,
    verify_self_signed,
)
from onnxcast.rollout.store import dump_json

TRUST_DIR = "trust"
ROOT_FILE = "root.json"
STATE_FILE = "state.json"
MAX_ROOT_BYTES = 1 << 20
MAX_ROOT_STEPS = 64  # root versions walked in one pull


def install_trust(dest: str | Path, root_file: str | Path, *, replace: bool = False) -> int:
    """Install ``root_file`` as the device's trust root (self-signed by a threshold of its
    root keys, not expired). Refuses to replace a newer installed root unless ``replace``.
    Returns the installed root's version."""
    root_file = Path(root_file)
    data = _read_user_root(root_file)
    root = _check_root(data, str(root_file))
    with open_device_folder(dest, create=True) as folder, folder.locked():
        trust = _TrustFiles(folder)
        current = trust.root()
        if current is not None and not replace and current.signed.version > root.signed.version:
            raise ConfigError(f"{trust.where(ROOT_FILE)}: holds root version {current.signed.version}, newer than "
                              f"{root_file}'s {root.signed.version}; pass --replace to go back on purpose")
        trust.write(ROOT_FILE, data)
    return root.signed.version


class DeviceTrust:
    """The trust root and verified state of one device folder (open: onnxcast.rollout.device)."""

    def __init__(self, folder: DeviceFolder, trust_file: str | Path | None = None):
        self.files = _TrustFiles(folder)
        self.folder = folder.path / TRUST_DIR
        given = trust_file or environment.get(TRUST_ENV)
        self.root = self._load(given)
        # A root held in memory pins its keys: no chain is walked from it (a writer checking
        # what its own keys just signed).
        self.pinned = given is not None and not isinstance(given, str | os.PathLike)

    # --- the root -------------------------------------------------------------------------
    def update_root(self, store, up_to: int) -> int:
        """Walk the store's root chain from the trusted version up to ``up_to`` (the root
        version the channel pointer names; unverified, so a lie only costs a refusal);
        returns the version now trusted. A root that does not chain is refused (the trusted
        one stays), and so is a missing one."""
        if self.pinned:
            return self.root.signed.version
        up_to = min(up_to, self.root.signed.version + MAX_ROOT_STEPS)
        while self.root.signed.version < up_to:
            key = store.root_key(self.root.signed.version + 1)
            where = store.url(key)
            data = store.read(key, MAX_ROOT_BYTES)
            if data is None:
                raise RefusedError(f"{where}: missing, though the channel pointer names root version {up_to}; "
                                   "refusing it")
            if len(data) > MAX_ROOT_BYTES:
                raise RefusedError(f"{where}: longer than {MAX_ROOT_BYTES} bytes; refusing it")
            new = parse_root(data, where)
            verify_next_root(self.root, new, where)
            self.root = new
            self.files.write(ROOT_FILE, data)
        check_root_fresh(self.root, str(self.folder / ROOT_FILE))
        return self.root.signed.version

    # --- metadata -------------------------------------------------------------------------
    def verify_pointer(self, envelope: object, model: str, channel: str, where: str,
                       now: datetime | None = None) -> dict:
        """The signed pointer fields, if signed by the pointer role, for this model and
        channel, not expired, not older than what this device verified, and not going
        back to an earlier version without a signed rollback record."""
        signed = check_signed_pointer(self.root, envelope, model, channel, where)
        expires = parse_time(signed.get("expires"), where)
        if (now or datetime.now(UTC)) >= expires:
            raise RefusedError(f"{where}: expired at {signed['expires']} (a frozen or stale channel); refusing it")
        root_version = signed.get("root_version", 0)
        if isinstance(root_version, int) and root_version > self.root.signed.version and not self.pinned:
            raise RefusedError(f"{where}: names root version {root_version}, the device trusts version "
                               f"{self.root.signed.version}; refusing it")
        counter = signed["counter"]
        state = self.channel_state(model, channel)
        if state:
            if counter < state["counter"]:
                raise RefusedError(f"{where}: counter {counter} is older than {state['counter']}, which this device "
                                   f"already verified (a replayed pointer); refusing it")
            if counter == state["counter"] and signed.get("version") != state["version"]:
                raise RefusedError(f"{where}: counter {counter} names version {signed.get('version')}, but this device "
                                   f"verified version {state['version']} under the same counter; refusing it")
            version = signed.get("version")
            rollback = signed.get("rollback") if isinstance(signed.get("rollback"), dict) else {}
            if version != state["version"] and version in state["versions"] and rollback.get("version") != version:
                raise RefusedError(f"{where}: goes back from version {state['version']} to {version}, which this "
                                   "device verified before, without a signed rollback record; refusing it")
        return signed

    def verify_manifest(self, envelope: object, model: str, version: str, where: str) -> dict:
        return check_signed_manifest(self.root, envelope, model, version, where)

    # --- state ----------------------------------------------------------------------------
    def channel_state(self, model: str, channel: str) -> dict | None:
        return self._state().get("channels", {}).get(f"{model}/{channel}")

    def record(self, model: str, channel: str, pointer: dict) -> None:
        """Remember ``pointer`` (verified and installed) as the newest for its channel."""
        state = self._state()
        channels = state.setdefault("channels", {})
        entry = channels.get(f"{model}/{channel}") or {"versions": []}
        versions = [v for v in entry.get("versions", []) if v != pointer["version"]] + [pointer["version"]]
        channels[f"{model}/{channel}"] = {"counter": pointer["counter"], "version": pointer["version"],
                                          "expires": pointer.get("expires"), "versions": versions[-1000:]}
        self.files.write(STATE_FILE, dump_json(state))

    def _state(self) -> dict:
        data = self.files.read(STATE_FILE)
        if data is None:
            return {}
        try:
            value = loads_json(data, what=self.files.where(STATE_FILE))
        except UntrustedInputError as exc:
            # Losing the state would let an old pointer be replayed: stop rather than guess.
            raise ConfigError(f"{exc}: unreadable device state; restore it or reinstall the device") from None
        return value if isinstance(value, dict) else {}

    def _load(self, trust_file):
        from tuf.api.metadata import Metadata

        if isinstance(trust_file, Metadata):  # a root held in memory (signing.signers_root)
            return trust_file
        have = self.files.root()
        if trust_file is None:
            if have is None:
                raise ConfigError(f"{self.folder.parent}: no trust root; pass --trust FILE, set {TRUST_ENV}, or "
                                  f"run '{device_command('trust --dest DEST --root root.json')}' once")
            return have
        data = _read_user_root(Path(trust_file))
        given = _check_root(data, str(trust_file))
        if have is not None and have.signed.version >= given.signed.version:
            return have  # the device already walked the chain past the file it was set up with
        self.files.write(ROOT_FILE, data)
        return given


def check_signed_pointer(root, envelope: object, model: str, channel: str, where: str) -> dict:
    """The signed fields of a channel pointer ``envelope`` if a threshold of ``root``'s
    pointer keys signed it for this model and channel and its counter is valid; RefusedError
    otherwise. What a device checks first, and what a writer checks of the pointer it is
    about to move from (expiry and replay are the device's own business)."""
    signed = verify_envelope(root, POINTER_ROLE, envelope, POINTER_TYPE, where)
    if (signed.get("model"), signed.get("channel")) != (model, channel):
        raise RefusedError(f"{where}: signed for {quote(signed.get('model'))} channel {quote(signed.get('channel'))}, "
                           f"not {model!r} channel {channel!r}; refusing it")
    counter = signed.get("counter")
    if not isinstance(counter, int) or isinstance(counter, bool) or counter < 0:
        raise RefusedError(f"{where}: no valid counter; refusing it")
    return signed


def check_signed_manifest(root, envelope: object, model: str, version: str, where: str) -> dict:
    """The signed fields of a version manifest if ``root``'s release keys signed it for this
    model and version; RefusedError otherwise (device and writers alike)."""
    signed = verify_envelope(root, MANIFEST_ROLE, envelope, MANIFEST_TYPE, where)
    if (signed.get("model"), signed.get("version")) != (model, version):
        raise RefusedError(f"{where}: signed for {quote(signed.get('model'))} version {quote(signed.get('version'))}, "
                           f"not {model!r} version {version!r}; refusing it")
    return signed


class _TrustFiles:
    """``DEST/trust/`` opened by descriptor (a symlinked ``trust/`` or file is refused)."""

    def __init__(self, folder: DeviceFolder):
        self.device = folder

    def where(self, name: str) -> Path:
        return self.device.path / TRUST_DIR / name

    def read(self, name: str) -> bytes | None:
        with self.device.folder(TRUST_DIR, create=False) as fd:
            if fd is None:
                return None
            return self.device.read(fd, name, f"{TRUST_DIR}/{name}", limit=MAX_ROOT_BYTES)

    def root(self):
        data = self.read(ROOT_FILE)
        return None if data is None else _check_root(data, str(self.where(ROOT_FILE)))

    def write(self, name: str, data: bytes) -> None:
        with self.device.folder(TRUST_DIR, create=True) as fd:
            self.device.write_atomic(fd, name, data)


def _read_user_root(path: Path) -> bytes:
    """A root file the user names (``--trust``, ``$ONNXCAST_TRUST``, ``edge trust --root``):
    a regular file of at most MAX_ROOT_BYTES."""
    try:
        return read_regular_file(path, what="trust root", limit=MAX_ROOT_BYTES)
    except UntrustedInputError as exc:
        raise ConfigError(f"{exc}; cannot read the trust root") from None


def _check_root(data: bytes, where: str):
    root = parse_root(data, where)
    verify_self_signed(root, where)
    return root

