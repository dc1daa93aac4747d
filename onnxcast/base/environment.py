"""The environment variables of onnxcast, each declared once: its name, how its text is read,
its default, what it is for, which components read it, and whether it is a secret.

Every module of the package reads a variable through this module (:func:`get` for the text,
:func:`value` for the typed value), at call time: a test or a deployment that changes the
environment is seen by the next call. A value that cannot be read fails with one line naming
the variable and the value (:class:`~onnxcast.base.errors.ConfigError`); a secret's value is
never shown, in an error, in :func:`describe` or in the documentation.

docs/environment.md is generated from :data:`VARIABLES`:
``python -m onnxcast.base.environment --markdown > docs/environment.md`` (a test compares the
two). Without an argument the module prints the variables as this process sees them.

Standard library only: the device distribution ships the base layer.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from onnxcast.base.errors import ConfigError

# Who reads a variable (the documentation groups by these)
EVERY = "every component"
PIPELINE = "pipeline"  # onnxcast pipeline and the training tasks
AIRFLOW = "airflow"  # the provider: tasks, the triggerer, the rollout page on the API server
ROLLOUT = "rollout"  # promote / rollback / refresh, on the command line and in tasks
DEVICE = "device"  # onnxcast-edge and `onnxcast edge`
SERVE = "serve"  # onnxcast serve
MONITOR = "monitor"  # onnxcast monitor and the monitor DAG
REGISTRY = "registry"  # the MLflow tracking and registry code, on the command line and in tasks


@dataclass(frozen=True)
class Variable:
    """One environment variable. ``parse`` turns its text into the value (ValueError: the text is
    not one; its message says what was expected); ``default`` is the value when it is unset or
    empty, ``shown_default`` what the documentation says when that is not a plain value.
    ``airflow_cfg``: the ``[onnxcast]`` key of airflow.cfg that stands in when the variable is unset
    (onnxcast.airflow.settings reads it). ``package``: False for variables only tools read."""

    name: str
    help: str
    readers: tuple[str, ...]
    parse: Callable[[str], Any] = str
    default: Any = None
    shown_default: str | None = None
    secret: bool = False
    airflow_cfg: str | None = None
    package: bool = True

    def documented_default(self) -> str:
        if self.secret:
            return "(secret: none)"
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None:
            return "none"
        if isinstance(self.default, int) and not isinstance(self.default, bool):
            return f"`{self.default:,}`".replace(",", "_") if self.default >= 10_000 else f"`{self.default}`"
        return f"`{self.default}`"


def number_of(unit: str, low: float, high: float) -> Callable[[str], float]:
    """A parser: a number of ``unit`` from ``low`` to ``high`` (both included)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not low <= value <= high:
            raise ValueError(f"is not a number of {unit} from {low:g} to {high:g}")
        return value

    parse.expects = f"a number of {unit} from {low:g} to {high:g}"  # type: ignore[attr-defined]
    return parse


def count_of(unit: str) -> Callable[[str], int]:
    """A parser: a whole number of ``unit``, at least 1."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"is not a whole number of {unit}") from None
        if value < 1:
            raise ValueError(f"is not a positive number of {unit}")
        return value

    parse.expects = f"a whole number of {unit}, at least 1"  # type: ignore[attr-defined]
    return parse


def days(text: str) -> float:
    """A parser: a number of days (the range is the reader's: it applies to options too)."""
    try:
        return float(text)
    except ValueError:
        raise ValueError("is not a number of days") from None


days.expects = "a number of days"  # type: ignore[attr-defined]


def one_of(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"is not one of {', '.join(choices)}")
        return text

    parse.expects = " or ".join(f"`{c}`" for c in choices)  # type: ignore[attr-defined]
    return parse


def folders(text: str) -> list[str]:
    """A parser: folders separated by ``os.pathsep`` (``:``; ``;`` on Windows), blanks skipped."""
    return [part for part in text.split(os.pathsep) if part.strip()]


folders.expects = "folders separated by `:`"  # type: ignore[attr-defined]


def text(what: str) -> Callable[[str], str]:
    """A parser that takes the text as it is; ``what`` says in the documentation what it holds."""

    def parse(value: str) -> str:
        return value

    parse.expects = what  # type: ignore[attr-defined]
    return parse


def _declare(*variables: Variable) -> dict[str, Variable]:
    declared: dict[str, Variable] = {}
    for variable in variables:
        if variable.name in declared:
            raise ValueError(f"{variable.name} declared twice")
        declared[variable.name] = variable
    return declared


SECONDS_1_3600 = number_of("seconds", 1, 3600)
FOLDER, FILE = text("a folder"), text("a file")

VARIABLES: dict[str, Variable] = _declare(
    # --- every component ------------------------------------------------------------------
    Variable("ONNXCAST_HOME", "The folder of onnxcast's local state: MLflow's SQLite store, keys, run folders, the "
             "embedded rollout store, served versions, monitor data.", (EVERY,), FOLDER,
             shown_default="`./.onnxcast` (the working directory's; `make` and the repository's scripts: the "
                           "repository's)"),
    # --- the package ----------------------------------------------------------------------
    Variable("ONNXCAST_STORE_SSE", "Server-side encryption of the objects written to S3 (rollout store, run store); "
             "the `sse` extra of an Airflow `aws` connection wins.", (ROLLOUT, PIPELINE, AIRFLOW),
             one_of("AES256", "aws:kms"), "AES256"),
    Variable("ONNXCAST_STORE_SSE_KMS_KEY_ID", "The KMS key of `ONNXCAST_STORE_SSE=aws:kms` (none: the bucket's "
             "default key); the `sse_kms_key_id` extra of an Airflow `aws` connection wins.",
             (ROLLOUT, PIPELINE, AIRFLOW), text("a KMS key id, ARN or alias")),
    Variable("ONNXCAST_MLFLOW_UI_URL", "The MLflow UI that the links of tasks, runs and the rollout page point at "
             "when the tracking URI is not an http(s) server (the embedded SQLite store: `mlflow ui`).",
             (PIPELINE, AIRFLOW), text("a URL"), "http://127.0.0.1:5000"),
    Variable("ONNXCAST_MAX_DATA_BYTES", "The size of a data file, or of all the Parquet files of a data set, as "
             "stored (held in memory, hashed and parsed: about 3x at the peak). docs/data-quality.md, stage 1.",
             (PIPELINE, MONITOR), count_of("bytes"), 2 * 1024**3, "`2_147_483_648` (2 GiB)"),
    Variable("ONNXCAST_MAX_DATA_ROWS", "The rows a data set may decode to, checked before decoding (Parquet footer, "
             "CSV lines).", (PIPELINE, MONITOR), count_of("rows"), 20_000_000),
    Variable("ONNXCAST_MAX_DATA_CELLS", "The cells (rows x columns read) a data set may decode to, checked before "
             "decoding.", (PIPELINE, MONITOR), count_of("cells"), 100_000_000),
    Variable("ONNXCAST_WORKER_HOSTNAME", "The host name a run folder's commit marker records (who published a "
             "step's outputs); the test stack gives each worker \"host\" its own.", (PIPELINE, AIRFLOW),
             text("a host name"), shown_default="the host's fully qualified name"),
    Variable("ONNXCAST_SIGNING_KEY", "The release key(s) that sign manifests and channel pointers: key files or "
             "`awskms:<key id|ARN|alias>`, comma-separated; `--signing-key` wins. docs/rollout-security.md.",
             (ROLLOUT, AIRFLOW), text("key files or `awskms:` URIs, comma-separated"),
             shown_default="none (the embedded Airflow mode: a development key under `$ONNXCAST_HOME/keys`)"),
    Variable("ONNXCAST_TRUST", "The trust root file (`root.json`) a verified pull starts from: a device's first "
             "pull, `onnxcast serve`, a promotion's model repository, the monitor, the rollout page's device "
             "check; `--trust` wins.", (DEVICE, SERVE, ROLLOUT, MONITOR, AIRFLOW), FILE,
             shown_default="a device's installed root (`DEST/trust/root.json`); the embedded Airflow mode: the "
                           "development root"),
    Variable("ONNXCAST_EDGE_TARGET", "The deployment target a device pulls and runs its channel's model for, in "
             "place of the one it resolves from its machine, CPU and runtimes (docs/targets.md, \"The device's "
             "target\"); refused when it is not declared, not for this machine, or not validated for the channel; "
             "`onnxcast-edge pull --target` wins.", (DEVICE,),
             text("a target: `x86_64`, `aarch64`, `openvino`, `tvm-aarch64`, `cuda`, `tensorrt`"),
             shown_default="none (resolved by the device)"),
    Variable("ONNXCAST_POINTER_EXPIRES_DAYS", "Days a new channel pointer stays valid (more than 0, at most 3660); "
             "`--expires-days` wins.", (ROLLOUT, AIRFLOW), days, 30.0, "`30`"),
    Variable("ONNXCAST_ACTOR", "Who a command-line promotion or rollback is recorded as, in the channel history.",
             (ROLLOUT,), text("a name"), shown_default="`user@host`"),
    Variable("ONNXCAST_DATA_ROOTS", "Folders a report's own local `data_uri` may be in, besides `ONNXCAST_HOME` "
             "(a path read from a report is never trusted because of where it was read).", (MONITOR,), folders,
             shown_default="none"),
    Variable("ONNXCAST_SERVE_TOKEN", "The bearer token `onnxcast serve` requires (`--token-file` wins); needed to "
             "listen beyond 127.0.0.1.", (SERVE,), text("a token"), secret=True),
    # --- the Airflow deployment ([onnxcast] of airflow.cfg when unset) -------------------------
    Variable("ONNXCAST_MODE", "`embedded`: one machine; tasks fall back to local folders under `ONNXCAST_HOME`, a "
             "SQLite MLflow store and a development signing key (the repository's airflow.cfg). Anything else is "
             "`deployed`: a missing setting or connection fails the task, naming it.", (AIRFLOW,),
             text("`embedded` or anything else"), "deployed", airflow_cfg="mode"),
    Variable("ONNXCAST_RUN_ROOT", "Where the tasks of a DAG run hand files to each other (the run store): an "
             "`s3://` URL every worker can reach; the DAG param `run_root` wins.", (AIRFLOW,),
             text("an `s3://` URL (a folder: the embedded mode)"),
             shown_default="the embedded mode: `$ONNXCAST_HOME/runs`; deployed: none (the task fails)",
             airflow_cfg="run_root"),
    Variable("ONNXCAST_STORE_URI", "The rollout store (versions, signed channel pointers); the DAG param "
             "`store_uri` wins.", (AIRFLOW,), text("an `s3://` URL or a folder"),
             shown_default="the embedded mode: `$ONNXCAST_HOME/rollout`; deployed: none (the task fails)",
             airflow_cfg="store_uri"),
    Variable("ONNXCAST_CHANNEL_ALIASES", "channel=alias pairs: the MLflow registry aliases the alias watcher reads "
             "as \"deploy this version to that channel\", moved by every promotion and rollback (command line and "
             "DAGs). One alias per channel: the same alias for two channels is refused (a refusal on one channel "
             "would move back the alias the other serves), so `champion` may drive at most one channel "
             "(`edge=edge,cloud=champion`; every promotion moves `champion`, so that channel follows every "
             "promotion of the other); `challenger` is refused (the training DAG sets it on every trained model: "
             "a channel on it would deploy each one, skipping the champion comparison) and `latest` is reserved by "
             "MLflow.", (ROLLOUT, AIRFLOW), text("`channel=alias` pairs, comma-separated"), "edge=edge,cloud=cloud",
             airflow_cfg="channel_aliases"),
    Variable("ONNXCAST_REGISTRY_POLL_SECONDS", "How often the alias watcher (in the triggerer) reads the registry.",
             (AIRFLOW,), SECONDS_1_3600, 15.0, "`15`", airflow_cfg="registry_poll_seconds"),
    Variable("ONNXCAST_RETRY_DELAY_SECONDS", "Seconds a failed task waits for its retry, for every onnxcast DAG, "
             "read where the DAG file is parsed: a bad value fails the parse naming the variable. The test stack "
             "shortens it.", (AIRFLOW,), SECONDS_1_3600,
             shown_default="each DAG's own: 1 min for `onnxcast_training`, 5 min for the others that retry",
             airflow_cfg="retry_delay_seconds"),
    # --- MLflow's own, which onnxcast reads too -------------------------------------------
    Variable("MLFLOW_TRACKING_URI", "MLflow's tracking server (MLflow reads it too). onnxcast's commands track to "
             "it, and `promote`/`rollback`/`refresh` keep its registry's aliases in step; an Airflow task takes "
             "the `mlflow_default` connection instead.", (REGISTRY, ROLLOUT), text("a URI"),
             shown_default="`sqlite:///$ONNXCAST_HOME/mlflow/mlflow.db` (the embedded store); a release without it "
                           "moves the pointer only"),
    Variable("MLFLOW_TRACKING_USERNAME", "MLflow's basic-auth login (with `MLFLOW_TRACKING_PASSWORD`, which only "
             "MLflow reads); onnxcast names the user in a refusal (HTTP 403). An Airflow task takes the login of "
             "the `mlflow_default` connection instead.", (REGISTRY, ROLLOUT), text("a user name")),
    # --- tools: read by scripts/, deploy/, docker/ and tests, never by the package ------------
    Variable("ONNXCAST_REPO", "The repository, for airflow.cfg's `${ONNXCAST_REPO}/dags` (scripts/airflow_env.py "
             "sets it).", ("airflow.cfg",), FOLDER, package=False),
    Variable("ONNXCAST_ARM_SYSROOT", "The Arm sysroot the emulated aarch64 targets run in (Debian's arm64 "
             "python3.11 with the aarch64 wheels; `scripts/arm_sysroot.py`, `make arm-tools`). docs/targets.md.",
             ("onnxcast.targets",), text("a folder"), shown_default="`$ONNXCAST_HOME/targets/aarch64-py311`"),
    Variable("ONNXCAST_STACK_NAME", "`scripts/stack.py up --name`: the PostgreSQL database prefix of a stack.",
             ("scripts/stack.py",), text("a name"), package=False),
    Variable("ONNXCAST_STACK_REDIS_DB", "`scripts/stack.py up --redis-db`: the Redis database of a stack's broker.",
             ("scripts/stack.py",), text("a number"), package=False),
    Variable("ONNXCAST_STACK_HEARTBEAT_TIMEOUT", "`scripts/stack.py up --heartbeat-timeout`.",
             ("scripts/stack.py",), text("seconds"), package=False),
    Variable("ONNXCAST_STACK_RETRY_DELAY", "`scripts/stack.py up --retry-delay`: sets "
             "`ONNXCAST_RETRY_DELAY_SECONDS` for the stack's Airflow.", ("scripts/stack.py",), text("seconds"),
             package=False),
    Variable("ONNXCAST_STACK_DIR", "Set by scripts/stack.py on every process of one stack, so that `stack-down` "
             "finds them.", ("scripts/stack_processes.py",), FOLDER, package=False),
    Variable("ONNXCAST_STACK_FULL_LOOP", "`1`: tests/stack waits until the channel serves the retrained version.",
             ("tests/stack",), text("`1` or unset"), package=False),
    Variable("ONNXCAST_AIRFLOW_CHART", "An unpacked Apache Airflow Helm chart for tests/deploy.", ("tests/deploy",),
             FOLDER, package=False),
    Variable("ONNXCAST_HELM", "The helm binary deploy/helm/render.py runs (deploy/helm/install-helm.sh prints it).",
             ("deploy/helm/render.py",), FILE, shown_default="`helm` on the PATH", package=False),
    Variable("ONNXCAST_SECRETS", "docker/.env: the folder (mode 0700) of the Compose secrets "
             "docker/make-secrets.py makes.", ("docker/docker-compose.yml",), FOLDER, package=False),
    Variable("ONNXCAST_IMAGE", "docker/.env: the Airflow image Compose runs.", ("docker/docker-compose.yml",),
             text("an image name"), "onnxcast-airflow:0.1.0", package=False),
)


def variable(name: str) -> Variable:
    """The declaration of ``name``; KeyError naming it when it is not declared."""
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not declared in onnxcast.base.environment") from None


def get(name: str) -> str | None:
    """The text of ``name`` in the environment now, as set; None when it is unset, empty or blank."""
    variable(name)
    text = os.environ.get(name)
    return text if text and text.strip() else None


def value(name: str, text: str | None = None) -> Any:
    """The value of ``name``: ``text`` when given (another source of the same setting, such as
    airflow.cfg), else the environment's text, read by the declaration's parser; the default when
    neither is set. ConfigError naming the variable and the value when it cannot be read."""
    declared = variable(name)
    if text is None:
        text = get(name)
    if text is None or not text.strip():
        return declared.default
    try:
        return declared.parse(text)
    except ValueError as exc:
        shown = "its value" if declared.secret else repr(text[:40])
        raise ConfigError(f"{name}: {shown} {exc}") from None


def default(name: str) -> Any:
    """The value of ``name`` when it is not set."""
    return variable(name).default


@contextmanager
def scoped(values: dict[str, str | None]) -> Iterator[None]:
    """``values`` set in the environment for the block (None: removed), then what was there before
    put back. For libraries that read a setting only from their own environment variables, on
    every call (MLflow's basic-auth login: onnxcast.airflow.hooks.MlflowHook.login): nothing
    outlives the block, in this process or in the subprocesses it starts later."""
    before = {name: os.environ.get(name) for name in values}
    try:
        for name, text in values.items():
            _put(name, text)
        yield
    finally:
        for name, text in before.items():
            _put(name, text)


def restoring(*names: str) -> AbstractContextManager[None]:
    """A block after which the variables ``names`` are as before it, whatever the block wrote
    (``mlflow.set_tracking_uri`` also exports the URI for subprocesses: onnxcast.registry.tracking)."""
    return scoped({name: os.environ.get(name) for name in names})


def set_default(name: str, text: str) -> None:
    """``name`` set to ``text`` for this process unless it is set already (the deployment's value
    wins). Only for another library's tuning that it reads from its environment alone (MLflow's
    request retries and progress bars: onnxcast.registry.tracking.bound_requests)."""
    os.environ.setdefault(name, text)


def _put(name: str, text: str | None) -> None:
    if text is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = text


def describe(names: Iterable[str] | None = None) -> list[str]:
    """``NAME=value`` lines for the variables set now (a secret as ``(set)``), ``NAME`` unset otherwise."""
    lines = []
    for name in names or VARIABLES:
        text = get(name)
        shown = "unset" if text is None else "(set)" if VARIABLES[name].secret else text
        lines.append(f"{name}={shown}" if text is not None else f"{name} {shown}")
    return lines


# --- the documentation --------------------------------------------------------------------

MARKDOWN_HEAD = """<!-- Generated from onnxcast/base/environment.py: edit the declarations there, then run
     python -m onnxcast.base.environment --markdown > docs/environment.md
     (tests/onnxcast/base/test_environment.py fails while this file differs). -->
# Environment variables

Every environment variable onnxcast reads, declared once in `onnxcast/base/environment.py`
and read through it, at call time. An empty (or blank) value counts as unset. A value that cannot be read
fails with one line naming the variable and the value (a secret's value is never shown). The
variables of the Airflow deployment may be set in the `[onnxcast]` section of airflow.cfg
instead (`AIRFLOW__ONNXCAST__<KEY>` works too); the environment wins.
`python -m onnxcast.base.environment` prints what the current process sees.
"""

def _ours(v: Variable) -> bool:
    return v.package and v.name.startswith("ONNXCAST_")


_SECTIONS = (
    ("Every component", lambda v: _ours(v) and v.readers == (EVERY,)),
    ("The package", lambda v: _ours(v) and v.readers != (EVERY,) and v.airflow_cfg is None),
    ("The Airflow deployment", lambda v: _ours(v) and v.airflow_cfg is not None),
    ("MLflow's own, read by onnxcast too", lambda v: v.package and not v.name.startswith("ONNXCAST_")),
    ("Development and deployment tools (the package never reads them)", lambda v: not v.package),
)


def markdown() -> str:
    """docs/environment.md: one table per group of variables."""
    parts = [MARKDOWN_HEAD]
    for title, belongs in _SECTIONS:
        rows = [v for v in VARIABLES.values() if belongs(v)]
        cfg = any(v.airflow_cfg for v in rows)
        parts.append(f"\n## {title}\n\n")
        parts.append("| variable | " + ("airflow.cfg | " if cfg else "") + "read by | value | default | what |\n")
        parts.append("|---|" + ("---|" if cfg else "") + "---|---|---|---|\n")
        for v in rows:
            expects = getattr(v.parse, "expects", "text")
            if v.secret:
                expects += " (secret)"
            cells = [f"`{v.name}`", *([f"`[onnxcast] {v.airflow_cfg}`"] if cfg else []), ", ".join(v.readers),
                     expects, v.documented_default(), v.help.replace("|", "\\|")]
            parts.append("| " + " | ".join(cells) + " |\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--markdown"]:
        sys.stdout.write(markdown())
        return 0
    if args:
        print("usage: python -m onnxcast.base.environment [--markdown]", file=sys.stderr)
        return 2
    print("\n".join(describe(v.name for v in VARIABLES.values() if v.package)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
