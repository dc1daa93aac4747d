"""Registry-driven rollout: what the release manager asked for in the MLflow registry (a
channel alias on a model version) against what each channel of the rollout store serves.

:func:`reconcile` is the pure decision (registry state + channel state -> promotion
requests); :func:`read_registry` and :func:`write_rollout_state` are the MLflow calls around
it. The rollout state of a version on a channel is the model version tag
``onnxcast.rollout.<channel>``: JSON ``{"state": "pending"|"deployed"|"refused", "at",
"reason", "run_id", ...}``. A ``pending`` tag younger than :data:`PENDING_TTL` keeps the
watcher from asking again for the same version; an alias on a version ``refused`` for its
channel is moved back (a revert request), not asked for again.

Names and versions read from the registry are untrusted: a model name that is not a store
name (``[A-Za-z0-9][A-Za-z0-9._-]{0,127}``) or a version that is not a number is skipped
before it reaches a run id or a store key. mlflow is imported inside functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

ROLLOUT_TAG_PREFIX = "onnxcast.rollout."
PENDING, DEPLOYED, REFUSED = "pending", "deployed", "refused"
FAILED, SUPERSEDED = "failed", "superseded"
PENDING_TTL = timedelta(minutes=30)
# latest: MLflow reserves it (models:/name@latest is the newest version); challenger: the
# training DAG moves it to every trained model (a channel on it would deploy them all)
RESERVED_ALIASES = ("latest", "challenger")
DEFAULT_CHANNEL_ALIASES = "edge=edge,cloud=cloud"
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
VERSION = re.compile(r"[1-9][0-9]{0,8}")
# MLflow's own alias rule (alias names: letters, digits, _ and -) less what it reserves
ALIAS = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TAG_CHARS = 5000
MAX_MODELS = 10_000  # one poll reads at most this many registered models


PROMOTE, REVERT = "promote", "revert"


@dataclass(frozen=True)
class Request:
    """Promote ``version`` of ``model`` to ``channel``: alias ``alias`` asks for it, the channel
    serves ``serving`` (None: nothing yet). ``action`` "revert": the version was refused for
    the channel already; move the alias back instead (it must not claim a deployment)."""

    model: str
    channel: str
    alias: str
    version: str
    serving: str | None
    action: str = PROMOTE

    def payload(self, requested_at: str) -> dict:
        """The asset event's payload (docs/design/loop.md)."""
        fields = {k: v for k, v in asdict(self).items() if k != "action"}
        return {**fields, "requested_at": requested_at,
                "run_id": promote_run_id(self.model, self.channel, self.version, requested_at)}


@dataclass(frozen=True)
class ModelState:
    """One registered model as the watcher reads it: its aliases (alias -> version) and, for
    the versions an alias points to, their tags (None: the version does not exist)."""

    name: str
    aliases: Mapping[str, str]
    versions: Mapping[str, Mapping[str, str] | None]


def parse_channel_aliases(text: str | None, channels: Iterable[str]) -> dict[str, str]:
    """``"edge=edge,cloud=champion"`` -> ``{"edge": "edge", "cloud": "champion"}``; ValueError
    naming the part at fault (an unknown channel, a reserved or malformed alias, an alias named
    for two channels: a refusal on one would move the alias the other serves)."""
    known = tuple(channels)
    out: dict[str, str] = {}
    for part in (text if text is not None else DEFAULT_CHANNEL_ALIASES).split(","):
        part = part.strip()
        if not part:
            continue
        channel, sep, alias = (s.strip() for s in part.partition("="))
        if not sep or channel not in known:
            raise ValueError(f"channel_aliases: {part!r} is not <channel>=<alias> with a channel of "
                             f"{', '.join(known)}")
        if not ALIAS.fullmatch(alias):
            raise ValueError(f"channel_aliases: alias {alias!r} of channel {channel} is not an MLflow alias "
                             "name (letters, digits, _ and -)")
        if alias.lower() in RESERVED_ALIASES:
            raise ValueError(f"channel_aliases: alias {alias!r} of channel {channel} is reserved (latest: "
                             "MLflow's newest version; challenger: set on every trained model)")
        if channel in out:
            raise ValueError(f"channel_aliases: channel {channel} is named twice")
        shared = [c for c, a in out.items() if a.lower() == alias.lower()]
        if shared:
            raise ValueError(f"channel_aliases: alias {alias!r} is named for channels {shared[0]} and {channel}; "
                             "one alias drives one channel")
        out[channel] = alias
    return out


def reconcile(models: Iterable[ModelState], serving: Mapping[tuple[str, str], str | None],
              channel_aliases: Mapping[str, str], now: datetime) -> tuple[list[Request], list[str]]:
    """The promotions the registry asks for, and a note for each alias left alone on purpose.

    ``serving[(model, channel)]``: the version the channel serves (None: no pointer yet); a
    (model, channel) missing from it could not be read and is left alone this time."""
    requests: list[Request] = []
    notes: list[str] = []
    for model in models:
        if not MODEL_NAME.fullmatch(model.name):
            notes.append(f"model {model.name[:80]!r}: not a valid model name, ignored")
            continue
        for channel, alias in channel_aliases.items():
            version = model.aliases.get(alias)
            if version is None or (model.name, channel) not in serving:
                continue
            version = str(version)
            if not VERSION.fullmatch(version):
                notes.append(f"{model.name}@{alias}: version {version[:20]!r} is not a version number, ignored")
                continue
            current = serving[(model.name, channel)]
            if current == version:
                continue
            tags = model.versions.get(version)
            if tags is None:
                notes.append(f"{model.name}@{alias}: version {version} does not exist (deleted?), ignored")
                continue
            state = rollout_state(tags, channel)
            if state is not None and state.get("state") == PENDING and _age(state, now) < PENDING_TTL:
                continue  # a promotion of it is in flight
            if state is not None and state.get("state") == FAILED and _age(state, now) < PENDING_TTL:
                continue  # failed on an outage: asked again once PENDING_TTL has passed
            if state is not None and state.get("state") == REFUSED:
                notes.append(f"{model.name}@{alias}: v{version} was refused for {channel} "
                             f"({str(state.get('reason', ''))[:200]}); not asked again, alias moved back")
                requests.append(Request(model.name, channel, alias, version, current, REVERT))
                continue
            requests.append(Request(model.name, channel, alias, version, current))
    return requests, notes


def rollout_tag(channel: str) -> str:
    return f"{ROLLOUT_TAG_PREFIX}{channel}"


def rollout_state(tags: Mapping[str, str], channel: str) -> dict | None:
    """The parsed ``onnxcast.rollout.<channel>`` tag; None when absent or not a JSON object."""
    raw = tags.get(rollout_tag(channel))
    if not raw or len(raw) > MAX_TAG_CHARS:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def state_value(state: str, *, at: datetime, reason: str, run_id: str, **extra: object) -> str:
    """The tag's JSON text (the reason cut to fit MLflow's tag limit)."""
    value = {"state": state, "at": at.astimezone(UTC).isoformat(timespec="seconds"),
             "reason": " ".join(str(reason).split())[:1000], "run_id": run_id, **extra}
    return json.dumps(value, sort_keys=True)[:MAX_TAG_CHARS]


def promote_run_id(model: str, channel: str, version: str, requested_at: str) -> str:
    """The onnxcast_promote run id of one request: the same request gives the same id, so a
    retried dispatcher starts no second run. Only validated names go into it."""
    if not MODEL_NAME.fullmatch(model) or not VERSION.fullmatch(version) or not ALIAS.fullmatch(channel):
        raise ValueError(f"not a valid request: model {model[:80]!r}, channel {channel[:20]!r}, "
                         f"version {version[:20]!r}")
    stamp = re.sub(r"[^0-9TZ]", "", requested_at)[:16] or "0"
    return f"registry__{model}__{channel}__v{version}__{stamp}"


def check_request(client, model: str, channel: str, alias: str, version: str, run_id: str) -> str | None:
    """Why a promotion request must not start (None: it may): the registry, read again now,
    must still have ``alias`` on ``version``, and the version's rollout tag for ``channel``,
    when there is one, must be the watcher's ``pending`` with this ``run_id``."""
    from mlflow.exceptions import MlflowException

    try:
        now = str(client.get_model_version_by_alias(model, alias).version)
    except MlflowException:
        now = None
    if now != str(version):
        return f"alias {alias} of {model} names {'v' + now if now else 'no version'}, not v{version}"
    try:
        tags = dict(client.get_model_version(model, str(version)).tags or {})
    except MlflowException:
        return f"{model} v{version} cannot be read"
    state = rollout_state(tags, channel)
    if state is not None and (state.get("state") != PENDING or state.get("run_id") != run_id):
        return (f"{model} v{version} on {channel} is {str(state.get('state'))[:20]} for run "
                f"{str(state.get('run_id'))[:120]}, not pending for {run_id}")
    return None


def read_registry(client, channel_aliases: Mapping[str, str]) -> list[ModelState]:
    """Every registered model with a watched alias, and the tags of the versions those aliases
    point to (paged through the registry, at most :data:`MAX_MODELS` models)."""
    from mlflow.exceptions import MlflowException

    watched = set(channel_aliases.values())
    states: list[ModelState] = []
    token = None
    seen = 0
    while seen < MAX_MODELS:
        page = client.search_registered_models(max_results=500, page_token=token)
        for model in page:
            seen += 1
            aliases = {a: str(v) for a, v in (model.aliases or {}).items() if a in watched}
            if not aliases:
                continue
            versions: dict[str, dict | None] = {}
            for version in set(aliases.values()):
                if not VERSION.fullmatch(version) or not MODEL_NAME.fullmatch(model.name):
                    continue
                try:
                    versions[version] = dict(client.get_model_version(model.name, version).tags or {})
                except MlflowException as exc:
                    if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                        raise
                    versions[version] = None
            states.append(ModelState(model.name, aliases, versions))
        token = page.token
        if not token:
            break
    return states


def read_serving(states: Iterable[ModelState], channel_aliases: Mapping[str, str],
                 served: Callable[[str, str], str | None]) -> dict[tuple[str, str], str | None]:
    """``{(model, channel): version the channel serves}`` for every watched alias of ``states``."""
    out: dict[tuple[str, str], str | None] = {}
    for state in states:
        if not MODEL_NAME.fullmatch(state.name):
            continue
        for channel, alias in channel_aliases.items():
            if alias in state.aliases:
                out[(state.name, channel)] = served(state.name, channel)
    return out


def write_rollout_state(client, model: str, version: str, channel: str, state: str, *, reason: str,
                        run_id: str, at: datetime | None = None, **extra: object) -> str:
    """Write ``onnxcast.rollout.<channel>`` on the version; returns the tag's text."""
    value = state_value(state, at=at or datetime.now(UTC), reason=reason, run_id=run_id, **extra)
    client.set_model_version_tag(model, str(version), rollout_tag(channel), value)
    return value


def _age(state: Mapping, now: datetime) -> timedelta:
    try:
        at = datetime.fromisoformat(str(state.get("at")))
    except ValueError:
        return PENDING_TTL  # unreadable: treat as expired
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return now - at
