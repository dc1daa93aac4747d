"""A release: promote, roll back or refresh a channel, the rollout store and the registry together.

What a channel serves is said in two places: the signed channel pointer in the rollout store
(what devices and ``onnxcast serve`` follow; a rollback also signs a rollback record into it)
and the MLflow registry's aliases: ``champion`` and the channel's own alias
(``ONNXCAST_CHANNEL_ALIASES``, default ``edge=edge,cloud=cloud``), which the alias watcher
(onnxcast.airflow.triggers) reads as the desired state. A release moves both or neither:

1. **check**: the pointer is read and verified and the target version checked
   (onnxcast.rollout.promote), then the registry is read: the model's aliases, the target
   version registered, no alias held by a channel this release does not move, the alias a
   registry-sourced promotion came from still naming its version; a release record (tag
   ``onnxcast.release`` on the registered model, state ``moving``) is written, which also
   proves the user may edit the model before anything moves;
2. **pointer**: compare-and-swap in the store (onnxcast.rollout.promote);
3. **aliases**: the channel aliases (and ``champion``) follow, then the records (the
   champion's history, the version tags) and the release record (``done``).

A failure in 3 undoes what 2 and 3 moved: the aliases set back, each moved pointer restored
(onnxcast.rollout.promote.restore: a new signed pointer naming the version it had, action
``restore``), and one line says what failed and what was restored. A registry that cannot be
read or written in 1 stops the release with nothing moved. A channel's first pointer cannot be
taken back (the store never deletes); the line says so.

Without a registry (``registry=None``: the command line without ``--tracking-uri`` or
``MLFLOW_TRACKING_URI``, or ``--pointer-only``) only the pointer moves, and the result says so;
a model that is not registered has no aliases to follow (said too). Refresh re-signs the
pointer at its version: nothing the registry says changes, so it never touches the registry.

The command line (onnxcast.cli), the DAG operators (onnxcast.airflow.rollout) and the alias
watcher (its revert of a refused request: :meth:`Registry.revert`) are the callers.
mlflow is imported inside functions (Airflow operators import this module at run time).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxcast.base import environment
from onnxcast.base.errors import ConfigError, GateError, OnnxcastError, StoreError
from onnxcast.base.files import read_json, write_json
from onnxcast.pipeline.config import CHANNELS
from onnxcast.registry.alias_rollout import DEFAULT_CHANNEL_ALIASES, VERSION, parse_channel_aliases
from onnxcast.registry.plan import challengers
from onnxcast.registry.tracking import bound_requests, client_for, redact_uri
from onnxcast.rollout.promote import PromotionResult, default_actor, resolve_signers, restore
from onnxcast.rollout.promote import promote as promote_version
from onnxcast.rollout.promote import refresh as refresh_channel
from onnxcast.rollout.promote import rollback as rollback_channel
from onnxcast.rollout.store import RolloutStore, open_store

CHAMPION = "champion"
CHANNEL_ALIASES_ENV = "ONNXCAST_CHANNEL_ALIASES"
RELEASE_TAG = "onnxcast.release"  # on the registered model: the last release, and "moving" while one runs
MAX_TAG = 5000
NO_REGISTRY = "no registry configured (set MLFLOW_TRACKING_URI or pass --tracking-uri to move the aliases too)"


class ReleaseError(OnnxcastError):
    """The registry could not follow the release; the line says what was moved back."""


class RegistryUnreachable(ReleaseError):
    """The registry could not be read or written; nothing moved."""


class NotPromoted(OnnxcastError):
    """The champion/challenger decision keeps the champion: nothing to release."""


class GatesRechecked(GateError):
    """The gates of a staged version, evaluated again before its promotion, failed."""

    def __str__(self) -> str:
        return f"gates re-checked and failed: {super().__str__()}"


class Superseded(ReleaseError):
    """A registry-sourced promotion whose alias names another version now; nothing moved."""

    def __init__(self, message: str, now: str | None):
        super().__init__(message)
        self.now = now


@dataclass(frozen=True)
class AliasMove:
    alias: str
    previous: str | None
    version: str

    def text(self) -> str:
        return f"{self.alias} {'v' + self.previous if self.previous else 'none'} -> v{self.version}"


@dataclass(frozen=True)
class Release:
    """What a release did: ``channels`` maps each channel to (version before, version now) and
    ``moved`` names those whose pointer moved; ``aliases`` the registry aliases it moved (all
    of them agree with the channels afterwards); ``pointer_only`` says why the registry was not
    followed (None: it was)."""

    action: str
    model: str
    store: str
    version: str
    channels: dict[str, tuple[str | None, str]]
    moved: tuple[str, ...]
    aliases: tuple[AliasMove, ...] = ()
    registry: str | None = None
    pointer_only: str | None = None
    promotion: PromotionResult | None = None
    signed: dict = field(default_factory=dict)  # refresh: the new pointer's fields
    manifest: str | None = None  # promote: where the version's manifest is
    repeated: bool = False  # rollback_once: an earlier try of the same rollback had made it

    @property
    def changed(self) -> bool:
        return bool(self.moved) or bool(self.aliases) or bool(self.promotion and self.promotion.written)

    def line(self) -> str:
        """The one line the command line prints."""
        if self.action == "refresh":
            (channel,) = self.channels
            return (f"{self.model} channel {channel}: version {self.version} re-signed, counter "
                    f"{self.signed.get('counter')}, expires {self.signed.get('expires')}")
        if self.action == "rollback":
            ((channel, (before, now)),) = self.channels.items()
            head = (f"{self.model} channel {channel}: rolled back from {before} to {now}" if self.moved
                    else f"{self.model} channel {channel}: already at {now}")
        else:
            result = self.promotion
            moves = ", ".join(f"{c} {'moved' if c in self.moved else 'unchanged'}" for c in self.channels)
            head = (f"{self.model} version {self.version} at {self.store}: {len(result.written)} object(s) written, "
                    f"{len(result.skipped)} already there; {moves}")
        return f"{head}; {self.registry_text()}"

    def registry_text(self) -> str:
        if self.pointer_only is not None:
            return f"channel pointer only: {self.pointer_only}"
        if self.aliases:
            return f"registry aliases {', '.join(a.text() for a in self.aliases)} ({self.registry})"
        return f"registry aliases already agree ({self.registry})"

    def as_xcom(self) -> dict:
        return {"action": self.action, "model": self.model, "version": self.version, "store": self.store,
                "channels": {c: {"from": before, "to": now, "moved": c in self.moved}
                             for c, (before, now) in self.channels.items()},
                "aliases": {a.alias: {"from": a.previous, "to": a.version} for a in self.aliases},
                "registry": self.registry, "pointer_only": self.pointer_only, "changed": self.changed}


# --- the registry ----------------------------------------------------------------------------

class Registry:
    """The MLflow registry a release keeps in step with the store: where it is and which alias
    each channel has. Every call is bounded (onnxcast.registry.tracking.bound_requests) and a
    failure is one line (:class:`RegistryUnreachable`) naming the call, the server and why."""

    def __init__(self, tracking_uri: str, channel_aliases: Mapping[str, str] | None = None):
        self.tracking_uri = tracking_uri
        self.channel_aliases = dict(channel_aliases) if channel_aliases is not None else \
            parse_channel_aliases(DEFAULT_CHANNEL_ALIASES, CHANNELS)
        self._client = None

    @property
    def where(self) -> str:
        return redact_uri(self.tracking_uri)

    @property
    def client(self):
        if self._client is None:
            bound_requests()
            self._client = client_for(self.tracking_uri)
        return self._client

    def call(self, what: str, fn: Callable[[], Any], *, missing: Any = ...) -> Any:
        """``fn()``; ``missing`` when MLflow answers that the resource does not exist (when given),
        else RegistryUnreachable naming ``what`` and the reason on one line."""
        from mlflow.exceptions import MlflowException

        try:
            return fn()
        except MlflowException as exc:
            if missing is not ... and exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return missing
            raise RegistryUnreachable(f"registry {self.where}: {what} failed: {_why(exc)}") from None
        except (OSError, ValueError) as exc:  # requests' errors are OSErrors; a malformed answer
            raise RegistryUnreachable(f"registry {self.where}: {what} failed: {_why(exc)}") from None

    def aliases(self, model: str) -> dict[str, str] | None:
        """The registered model's aliases (alias -> version); None when it is not registered."""
        found = self.call(f"reading registered model {model!r}", lambda: self.client.get_registered_model(model),
                          missing=None)
        return None if found is None else {a: str(v) for a, v in (found.aliases or {}).items()}

    def has_version(self, model: str, version: str) -> bool:
        if not VERSION.fullmatch(version):  # a store version id that is not a registry version number
            return False
        found = self.call(f"reading {model} v{version}", lambda: self.client.get_model_version(model, version),
                          missing=None)
        return found is not None

    def set_alias(self, model: str, alias: str, version: str | None) -> None:
        """Point ``alias`` at ``version`` (None: delete it)."""
        if version is None:
            self.call(f"deleting alias {alias} of {model}",
                      lambda: self.client.delete_registered_model_alias(model, alias), missing=None)
        else:
            self.call(f"moving alias {alias} of {model} to v{version}",
                      lambda: self.client.set_registered_model_alias(model, alias, version))

    def tag_model(self, model: str, key: str, value: str) -> None:
        self.call(f"writing tag {key} on {model}",
                  lambda: self.client.set_registered_model_tag(model, key, value[:MAX_TAG]))

    def tag_version(self, model: str, version: str, key: str, value: str) -> None:
        self.call(f"writing tag {key} on {model} v{version}",
                  lambda: self.client.set_model_version_tag(model, version, key, value[:MAX_TAG]))

    def revert(self, model: str, alias: str, refused: str, serving: str | None) -> str:
        """The alias watcher's half of a refused request: point ``alias`` back at the version the
        channel serves (delete it when the channel serves nothing), unless someone moved it away
        from the ``refused`` version meanwhile. Says what it did."""
        now = (self.aliases(model) or {}).get(alias)
        if now != str(refused):
            return f"alias {alias} now points at {'v' + now if now else 'nothing'}, not v{refused}: left alone"
        self.set_alias(model, alias, serving)
        if serving is None:
            return f"alias {alias} deleted (the channel serves nothing)"
        return f"alias {alias} moved back to v{serving} (what the channel serves)"


def registry_from_environment(tracking_uri: str | None = None, *,
                              channel_aliases: str | None = None) -> Registry | None:
    """The registry the command line releases with: ``tracking_uri``, else
    ``$MLFLOW_TRACKING_URI``; None when neither is set (a release then moves the pointer only).
    The channel aliases: ``channel_aliases``, else ``$ONNXCAST_CHANNEL_ALIASES``, else
    ``edge=edge,cloud=cloud`` (set it as the Airflow deployment sets it). Credentials come from
    MLflow's own ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` (or ``_TOKEN``)."""
    uri = tracking_uri or environment.get("MLFLOW_TRACKING_URI")
    if not uri:
        return None
    text = channel_aliases if channel_aliases is not None else environment.value(CHANNEL_ALIASES_ENV)
    try:
        aliases = parse_channel_aliases(text, CHANNELS)
    except ValueError as exc:
        raise ConfigError(f"{CHANNEL_ALIASES_ENV}: {exc}") from None
    return Registry(uri, aliases)


# --- the three releases ----------------------------------------------------------------------

def promote(report: str | Path, store: RolloutStore | str, model_name: str, channels: Sequence[str] | str, *,
            registry: Registry | None, version: str | None = None, move_champion: bool = True,
            expect_alias: tuple[str, str] | None = None, actor: str | None = None, reason: str = "",
            signers: Sequence | str | None = None, expires_days: float | None = None,
            overwrite_unverified: bool = False, no_registry: str = NO_REGISTRY) -> Release:
    """Publish the run of ``report`` as a version of ``model_name`` and move ``channels`` to it
    (onnxcast.rollout.promote.promote), with the channels' aliases and (``move_champion``)
    ``champion`` following. ``expect_alias`` (alias, version): a registry-sourced promotion,
    refused as :class:`Superseded` when that alias names another version by the time the
    channels would move."""
    store, signers, actor = _opened(store), resolve_signers(signers), actor or default_actor()
    step = _Step("promote", model_name, registry, actor=actor, reason=reason, move_champion=move_champion,
                 expect_alias=expect_alias)
    undo = _restorer(store, step, signers, expires_days, actor)
    with step.recording(undo):
        result = promote_version(report, store, model_name, channels, version=version, actor=actor, reason=reason,
                                 signers=signers, expires_days=expires_days,
                                 overwrite_unverified=overwrite_unverified, before_move=step.check,
                                 on_moved=step.pointers_moved.append)
    moved = tuple(c for c, state in result.channels.items() if state == "moved")
    aliases = step.follow(moved, undo=undo)
    return Release("promote", model_name, result.store, result.version, dict(step.moves), moved, aliases,
                   registry.where if registry else None, None if registry and step.registered else
                   step.pointer_only(no_registry), promotion=result,
                   manifest=store.url(store.version_key(model_name, result.version)))


def rollback(store: RolloutStore | str, model_name: str, channel: str, *, registry: Registry | None,
             to_version: str | None = None, move_champion: bool = True, actor: str | None = None, reason: str,
             signers: Sequence | str | None = None, expires_days: float | None = None,
             no_registry: str = NO_REGISTRY) -> Release:
    """Move ``channel`` back (onnxcast.rollout.promote.rollback: to ``to_version`` or the version
    it was promoted from, with a signed rollback record), the channel's alias and
    (``move_champion``) ``champion`` following. A channel already at the target still has its
    aliases brought in line."""
    store, signers, actor = _opened(store), resolve_signers(signers), actor or default_actor()
    step = _Step("rollback", model_name, registry, actor=actor, reason=reason, move_champion=move_champion)
    undo = _restorer(store, step, signers, expires_days, actor)
    with step.recording(undo):
        result = rollback_channel(store, model_name, channel, to_version=to_version, actor=actor, reason=reason,
                                  signers=signers, expires_days=expires_days, before_move=step.check)
    moved = (channel,) if result.changed else ()
    aliases = step.follow(moved, undo=undo)
    return Release("rollback", model_name, store.uri, result.version, dict(step.moves), moved, aliases,
                   registry.where if registry else None, None if registry and step.registered else
                   step.pointer_only(no_registry))


def refresh(store: RolloutStore | str, model_name: str, channel: str, *, signers: Sequence | str | None = None,
            expires_days: float | None = None, actor: str | None = None) -> Release:
    """Re-sign ``channel``'s pointer at the version it names (onnxcast.rollout.promote.refresh):
    what it serves does not change, so the registry is not touched."""
    store = _opened(store)
    value = refresh_channel(store, model_name, channel, signers=signers, expires_days=expires_days, actor=actor)
    version = str(value["version"])
    return Release("refresh", model_name, store.uri, version, {channel: (version, version)}, (), (), None,
                   "a refresh keeps the version", signed=value)


# --- the releases the DAGs ask for ------------------------------------------------------------
# onnxcast_training and onnxcast_promote promote a run after a decision, roll back once however
# often the task is retried, and refresh every channel that exists; the operators
# (onnxcast.airflow.rollout) call these and map the typed outcomes to skip or fail. The store,
# the signers and the registry may be given as functions, called (in that order) only when the
# release gets that far, so a promotion the decision skips needs no store, key or registry.

REGISTRY_SOURCE = "registry"  # a promotion the registry alias watcher asked for


def checked_decision(decision: Any, *, required: bool) -> dict | None:
    """The champion/challenger decision, or None when none was asked for (``required`` False);
    ConfigError for anything but a mapping with a boolean ``promote``.

    A template rendered without ``render_template_as_native_obj`` arrives as a string, and a
    missing XCom as None: promoting then would skip the comparison with the champion."""
    if not required:
        return None
    if not isinstance(decision, dict) or not isinstance(decision.get("promote"), bool):
        shown = " ".join(str(decision).split())[:80]
        raise ConfigError(
            f"refusing to promote: decision must be the champion/challenger result, a mapping with a "
            f"boolean 'promote', got {type(decision).__name__} {shown!r} (is the DAG's "
            "render_template_as_native_obj on, and did the decision task run?)")
    return decision


def promote_run(cfg: Any, store: RolloutStore | str | Callable[[], RolloutStore], channels: Sequence[str] | str, *,
                registry: Registry | Callable[[], Registry | None] | None, version: str, decision: dict | None = None, reassemble: bool = False,
                reason: str = "", move_champion: bool = True, source: str | None = None, alias: str | None = None,
                actor: str | None = None, signers: Sequence | str | Callable[[], Sequence] | None = None) -> Release:
    """Promote the run of ``cfg`` (a PipelineConfig on its run folder) as ``version``: NotPromoted
    when ``decision`` keeps the champion; with ``reassemble`` the report is rebuilt from the run's
    validation first (its gates evaluated again: GatesRechecked). A registry-sourced run (``source``
    :data:`REGISTRY_SOURCE` with its ``alias``) is :class:`Superseded` when the alias has moved on
    from ``version`` by the time the channels would move. The reason: ``reason``, else the
    decision's, else "promoted by Airflow"."""
    if decision is not None and not decision["promote"]:
        raise NotPromoted(f"not promoted: {decision.get('reason')}")
    if reassemble:
        reassemble_report(cfg)
    reason = reason or (decision or {}).get("reason") or "promoted by Airflow"
    store = _opened(_called(store))
    signers = _called(signers)
    expect = (str(alias), str(version)) if source == REGISTRY_SOURCE and _given(alias) else None
    return promote(cfg.run_dir, store, cfg.model_name, channels, registry=_called(registry), version=str(version),
                   move_champion=move_champion, expect_alias=expect, actor=actor, reason=reason, signers=signers)


def reassemble_report(cfg: Any) -> dict:
    """report.json rebuilt from the run's validation (the gates evaluated again:
    GatesRechecked), keeping the registry entry of the staged version's report."""
    # numpy, which release's callers do not load
    from onnxcast.pipeline.run import assemble_report

    staged = read_json(cfg.layout.staged)
    try:
        report = assemble_report(cfg, challengers(cfg.run_dir))
    except GateError as exc:
        raise GatesRechecked(exc.failures) from None
    report["mlflow"] = staged["mlflow"]
    write_json(cfg.layout.report, report)
    return report


def rollback_once(store: RolloutStore | str | Callable[[], RolloutStore], model_name: str, channel: str, *,
                  registry: Registry | Callable[[], Registry | None] | None, actor: str, reason: str,
                  to_version: str | None = None,
                  move_champion: bool = True, signers: Sequence | str | Callable[[], Sequence] | None = None) -> Release:
    """:func:`rollback`, unless the channel's last move is this ``actor``'s rollback with this
    ``reason`` to the version it serves (a retried task whose first try moved it: a second
    rollback would walk one version further back). Then that rollback, ``repeated``, nothing
    moved and the registry left as it is."""
    store = _opened(_called(store))
    done = earlier_rollback(store, model_name, channel, actor=actor, reason=reason)
    if done is not None:
        version = str(done["version"])
        return Release("rollback", model_name, store.uri, version, {channel: (done.get("from_version"), version)},
                       (), pointer_only="an earlier try made this rollback", repeated=True)
    signers = _called(signers)
    return rollback(store, model_name, channel, registry=_called(registry), to_version=_given(to_version),
                    move_champion=move_champion, actor=actor, reason=reason, signers=signers)


def earlier_rollback(store: RolloutStore, model_name: str, channel: str, *, actor: str, reason: str) -> dict | None:
    """The pointer history entry of ``actor``'s rollback with ``reason``, when it is the channel's
    last move and the pointer still names its version; None otherwise (or when the pointer
    cannot be read: the rollback itself then says why)."""
    try:
        pointer = store.read_channel(model_name, channel).value or {}
    except StoreError:
        return None
    history = pointer.get("history") or []
    last = history[-1] if history else {}
    if last.get("action") == "rollback" and last.get("by") == actor and last.get("reason") == reason \
            and last.get("version") == pointer.get("version"):
        return last
    return None


def refresh_channels(store: RolloutStore | str | Callable[[], RolloutStore], model_name: str,
                     channels: Sequence[str] | str, *, signers: Sequence | str | Callable[[], Sequence] | None = None,
                     expires_days: float | str | None = None, actor: str | None = None) -> dict[str, Release | None]:
    """:func:`refresh` of each of ``channels`` that has a pointer; None for one that does not
    exist yet (nothing to re-sign). ``expires_days`` may be text (a rendered template)."""
    store = _opened(_called(store))
    days = None if _given(expires_days) is None else float(expires_days)
    done: dict[str, Release | None] = {}
    for channel in [channels] if isinstance(channels, str) else list(channels):
        if store.read_channel(model_name, channel).value is None:
            done[channel] = None
            continue
        signers = _called(signers)
        done[channel] = refresh(store, model_name, channel, signers=signers, expires_days=days, actor=actor)
    return done


def _given(value: Any) -> str | None:
    """A templated optional argument: None, "" and "None" (a rendered None) are not given."""
    return None if value in (None, "", "None") else str(value)


def _called(value: Any) -> Any:
    """``value()`` for a function given in place of a store, signers or a registry, else ``value``."""
    return value() if callable(value) and not isinstance(value, (RolloutStore, Registry)) else value


# --- how a release keeps the registry with the store -----------------------------------------

class _Step:
    """One release's registry side: :meth:`check` before the pointers move (called by
    onnxcast.rollout.promote with the moves), :meth:`follow` after."""

    def __init__(self, action: str, model: str, registry: Registry | None, *, actor: str, reason: str,
                 move_champion: bool, expect_alias: tuple[str, str] | None = None):
        self.action, self.model, self.registry = action, model, registry
        self.actor, self.reason = actor, reason
        self.move_champion, self.expect_alias = move_champion, expect_alias
        self.moves: dict[str, tuple[str | None, str]] = {}
        self.wanted: list[AliasMove] = []  # every alias this release sets, moved or not
        self.pointers_moved: list[str] = []  # channels whose pointer moved (undone if a later one fails)
        self.registered = False

    def pointer_only(self, no_registry: str) -> str:
        if self.registry is None:
            return no_registry
        return f"{self.model!r} is not a registered model in the registry at {self.registry.where} (no aliases)"

    def check(self, moves: dict[str, tuple[str | None, str]]) -> None:
        """Read the registry and refuse, with nothing moved, when it cannot follow the moves."""
        self.moves = dict(moves)
        registry = self.registry
        if registry is None:
            return
        now = registry.aliases(self.model)
        if self.expect_alias is not None:
            alias, version = self.expect_alias
            named = (now or {}).get(alias)
            if named != str(version):
                raise Superseded(f"superseded: alias {alias} of {self.model} names "
                                 f"{'v' + named if named else 'no version'} now, not v{version}", named)
        if now is None:
            return
        self.registered = True
        wanted = self._wanted(registry, now)
        for version in sorted({move.version for move in wanted}):
            if not registry.has_version(self.model, version):
                raise ReleaseError(f"registry {registry.where}: {self.model} has no version {version}, so its aliases "
                                   f"({', '.join(m.alias for m in wanted if m.version == version)}) cannot follow the "
                                   "channel to it; nothing moved (release a registered version, or move the "
                                   "pointer only: --pointer-only)")
        self.wanted = wanted
        # the release record: written before anything moves, it proves this user may edit the
        # model (a 403 stops here, not after the pointer moved) and marks a release in flight
        registry.tag_model(self.model, RELEASE_TAG, self._record("moving"))

    def _wanted(self, registry: Registry, now: Mapping[str, str]) -> list[AliasMove]:
        """The aliases this release sets: each moved channel's own, and champion; refused when
        champion is the alias of a channel this release does not move to that version."""
        wanted: dict[str, str] = {}
        for channel, (_, version) in self.moves.items():
            alias = registry.channel_aliases.get(channel)
            if alias is not None:
                wanted[alias] = version
        if self.move_champion:
            versions = sorted({version for _, version in self.moves.values()})
            if len(versions) == 1:
                holder = next((c for c, a in registry.channel_aliases.items() if a == CHAMPION), None)
                if holder is not None and holder not in self.moves and now.get(CHAMPION) != versions[0]:
                    raise ReleaseError(f"registry {registry.where}: alias {CHAMPION} of {self.model} is channel "
                                       f"{holder}'s alias ({CHANNEL_ALIASES_ENV}), and this {self.action} does not "
                                       f"move {holder}: moving {CHAMPION} to v{versions[0]} would redeploy "
                                       f"{holder}; nothing moved (keep the champion where it is, or release "
                                       f"{holder} too)")
                wanted.setdefault(CHAMPION, versions[0])
        return [AliasMove(alias, now.get(alias), version) for alias, version in wanted.items()]

    @contextmanager
    def recording(self, undo: Callable[[Sequence[str], str], list[str]]) -> Iterator[None]:
        """The store's part of the release. When it fails after the check (an upload, a channel
        another writer moved first), the pointers it had moved already are restored (a promotion
        of edge and cloud whose cloud lost a race leaves edge as it was) and the release record
        says ``failed`` instead of ``moving``."""
        try:
            yield
        except OnnxcastError as exc:
            why = str(exc)
            restored = undo(self.pointers_moved, why) if self.pointers_moved else []
            if self.registry is not None and self.registered:
                self._try(lambda: self.registry.tag_model(self.model, RELEASE_TAG, self._record("failed", error=why)))
            if restored:
                raise ReleaseError(f"{why}; {'; '.join(restored)}") from None
            raise

    def follow(self, moved: Sequence[str], undo: Callable[[Sequence[str], str], list[str]]) -> tuple[AliasMove, ...]:
        """Move the aliases the check planned and write the records; on a failure set back what
        moved, ``undo`` the moved pointers, and raise one line naming both."""
        registry = self.registry
        if registry is None or not self.registered:
            return ()
        done: list[AliasMove] = []
        try:
            for move in self.wanted:
                if move.previous != move.version:
                    registry.set_alias(self.model, move.alias, move.version)
                    done.append(move)
            self._records(registry, done)
            registry.tag_model(self.model, RELEASE_TAG, self._record("done"))
        except ReleaseError as exc:
            why = str(exc)
            restored = self._undo(registry, done) + undo(moved, why)
            self._try(lambda: registry.tag_model(self.model, RELEASE_TAG, self._record("restored", error=why)))
            raise ReleaseError(f"{why}; {'; '.join(restored) if restored else 'nothing had moved'}") from None
        return tuple(done)

    def _records(self, registry: Registry, done: list[AliasMove]) -> None:
        """The champion's history (MLflow keeps none of aliases, mlflow#2169) and the version tags."""
        champion = next((m for m in self.wanted if m.alias == CHAMPION), None)
        if champion is None:
            return
        entry = json.dumps({"version": champion.version, "from_version": champion.previous, "action": self.action,
                            "channels": {c: v for c, (_, v) in self.moves.items()}, "by": self.actor,
                            "reason": self.reason}, sort_keys=True)
        if champion in done:
            registry.tag_model(self.model, f"onnxcast.champion.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}", entry)
            if champion.previous:
                registry.tag_version(self.model, champion.previous, "onnxcast.replaced_by", champion.version)
        registry.tag_version(self.model, champion.version, "onnxcast.promoted", entry)

    def _undo(self, registry: Registry, done: list[AliasMove]) -> list[str]:
        said = []
        for move in reversed(done):
            if self._try(lambda m=move: registry.set_alias(self.model, m.alias, m.previous)):
                said.append(f"alias {move.alias} set back to {'v' + move.previous if move.previous else 'none'}")
            else:
                said.append(f"alias {move.alias} could NOT be set back (it names v{move.version}; "
                            f"set it to {'v' + move.previous if move.previous else 'none'} by hand)")
        return said

    def _record(self, state: str, **extra: str) -> str:
        return json.dumps({"state": state, "action": self.action, "by": self.actor, "reason": self.reason,
                           "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "channels": {c: {"from": f, "to": t} for c, (f, t) in self.moves.items()},
                           "aliases": {m.alias: {"from": m.previous, "to": m.version} for m in self.wanted},
                           **extra}, sort_keys=True)

    @staticmethod
    def _try(fn: Callable[[], Any]) -> bool:
        try:
            fn()
            return True
        except OnnxcastError:
            return False


def _restorer(store: RolloutStore, step: _Step, signers: Sequence, expires_days: float | None,
              actor: str) -> Callable[[Sequence[str], str], list[str]]:
    """The compensation of a release whose aliases could not follow: each moved channel's
    pointer back to the version it had (a newly signed pointer, action ``restore``)."""
    def undo(moved: Sequence[str], why: str) -> list[str]:
        said = []
        for channel in moved:
            before, now = step.moves[channel]
            if before is None:
                said.append(f"channel {channel} had no pointer before and keeps v{now} (a store never deletes; "
                            "release it again once the registry answers)")
                continue
            try:
                done = restore(store, step.model, channel, version=before, replacing=now, actor=actor,
                               reason=f"restored: the registry could not follow the {step.action} ({why[:300]})",
                               signers=signers, expires_days=expires_days)
            except OnnxcastError as exc:
                said.append(f"channel {channel} could NOT be restored to v{before} ({_clip(str(exc))}): it serves "
                            f"v{now}")
                continue
            said.append(f"channel {channel} restored to v{before}" if done else
                        f"channel {channel} moved on since (left alone)")
        return said

    return undo


def _opened(store: RolloutStore | str) -> RolloutStore:
    return store if isinstance(store, RolloutStore) else open_store(store)


def _why(exc: BaseException) -> str:
    """Why an MLflow call failed, in a few words: HTTP 401/403 named, a connection failure as
    such, anything else the first 200 characters of its message."""
    text = " ".join(str(exc).split())
    code = re.search(r"error code (\d{3})", text)
    if code and code.group(1) == "401":
        return ("HTTP 401: not authenticated (set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or "
                "MLFLOW_TRACKING_TOKEN)")
    if code and code.group(1) == "403":
        user = environment.get("MLFLOW_TRACKING_USERNAME") or "this user"
        return f"HTTP 403: {user} may not do that (a user with EDIT on the model can)"
    if re.search(r"Max retries exceeded|Connection refused|Failed to establish|timed out|NameResolution", text):
        return "unreachable (" + _clip(text, 160) + ")"
    return _clip(text)


def _clip(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
