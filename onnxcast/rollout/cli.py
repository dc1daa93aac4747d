"""The device's commands: ``keys ...`` and ``edge pull|predict|trust`` (the writer's
``promote``, ``rollback`` and ``refresh`` are in :mod:`onnxcast.cli`).

``add_keys_commands`` and ``add_edge_commands`` register them; each sets ``handler`` (what
``onnxcast.cli.main`` calls) to a function that takes the parsed namespace and returns an
exit code. User errors are raised as
OnnxcastError for the main CLI to print on one line. S3 endpoint, region, credentials and
encryption come from the environment (``AWS_*``, ``ONNXCAST_STORE_SSE``,
``ONNXCAST_STORE_SSE_KMS_KEY_ID``), never from flags that would land in shell history.
Signing keys: ``--signing-key`` or ``$ONNXCAST_SIGNING_KEY`` (key files or ``awskms:KEY``);
a device's trust root: ``--trust`` or ``$ONNXCAST_TRUST`` or ``DEST/trust/root.json``.

``edge_main`` is the light device entry point (``onnxcast-edge``): ``pull``, ``predict``,
``trust`` and ``keys`` at the top level (``onnxcast-edge edge pull`` still works), without
the training CLI's imports.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from onnxcast import __version__
from onnxcast.base.errors import ConfigError, DataError, OnnxcastError, RefusedError
from onnxcast.base.untrusted import UntrustedInputError, read_regular_file
from onnxcast.rollout.command import (
    DEVICE_PROGRAM,
    device_command,
    keys_command,
    program,
    use_program,
)
from onnxcast.rollout.signing import (
    generate_key,
    kms_signer,
    load_signers,
    make_root,
    parse_root,
    read_public_key,
    sign_root,
    verify_next_root,
    verify_self_signed,
    write_public_key,
)
from onnxcast.rollout.store import open_store
from onnxcast.rollout.trust import MAX_ROOT_BYTES, install_trust


def add_keys_commands(subparsers: argparse._SubParsersAction) -> None:
    keys = subparsers.add_parser("keys", help="release keys and trust roots")
    commands = keys.add_subparsers(dest="keys_command", required=True)
    p = commands.add_parser("generate", help="a development key pair and a 1-of-1 trust root")
    p.add_argument("--out", required=True, help="folder for signing.key (mode 0600), signing.pub and root.json")
    p.add_argument("--root-expires-days", type=int, default=365, help="days the trust root stays valid (default 365)")
    p.set_defaults(handler=run_keys_generate)

    p = commands.add_parser("root", help="write a trust root (t of n keys per role), signed by the given keys; "
                                         "with --previous, the next root of that chain (key rotation)")
    p.add_argument("--out", required=True, help="root file to write")
    p.add_argument("--root-key", action="append", required=True, help="public key file of a root key (repeat)")
    p.add_argument("--release-key", action="append", required=True,
                   help="public key file of a release key: signs manifests and channel pointers (repeat)")
    p.add_argument("--root-threshold", type=int, default=1, help="root keys needed to sign a root (default 1)")
    p.add_argument("--release-threshold", type=int, default=1,
                   help="release keys needed to sign a manifest or pointer (default 1)")
    p.add_argument("--previous", help="the root this one replaces (its version + 1 is written)")
    p.add_argument("--sign-with", action="append", required=True,
                   help="private key file or awskms:KEY to sign with: old and new root keys (repeat)")
    p.add_argument("--expires-days", type=int, default=365, help="days this root stays valid (default 365)")
    p.set_defaults(handler=run_keys_root)

    p = commands.add_parser("publish-root", help="publish a root in the store (root/<version>.root.json) "
                                                 "for devices to walk to")
    p.add_argument("--store", required=True, help="rollout store: a folder or s3://bucket/prefix")
    p.add_argument("--root", required=True, help=f"root file from '{keys_command('root')}'")
    p.set_defaults(handler=run_keys_publish_root)

    p = commands.add_parser("kms-pub", help="write the public key of an AWS KMS signing key (for 'keys root')")
    p.add_argument("--key-id", required=True, help="KMS key id, ARN or alias")
    p.add_argument("--out", required=True, help="public key file to write")
    p.set_defaults(handler=run_keys_kms_pub)


def add_edge_commands(subparsers: argparse._SubParsersAction,
                      help: str = "device side: trust, pull a channel's model, run it") -> None:
    """``edge pull|predict|trust`` (the full install's spelling)."""
    edge = subparsers.add_parser("edge", help=help)
    add_device_commands(edge.add_subparsers(dest="edge_command", required=True))


def add_device_commands(commands: argparse._SubParsersAction) -> None:
    """``pull``, ``predict`` and ``trust`` on ``commands``: under ``onnxcast edge`` in the full
    install, at the top of ``onnxcast-edge`` on a device."""
    p = commands.add_parser("pull", help="download, verify and install the channel's model")
    store_arguments(p)
    p.add_argument("--channel", required=True, help="channel to follow (edge or cloud)")
    p.add_argument("--dest", required=True, help="device folder (DEST/current is the served model)")
    p.add_argument("--trust", help="trust root file (default: $ONNXCAST_TRUST, else DEST/trust/root.json)")
    p.add_argument("--watch", action="store_true", help="keep polling the channel")
    p.add_argument("--interval", type=float, default=60.0, help="seconds between polls (default 60)")
    p.add_argument("--max-polls", type=int, help="stop after this many polls (default: never)")
    p.add_argument("--target", help="deployment target to install the channel's model for (x86_64, aarch64, "
                                    "openvino, tvm-aarch64, cuda, tensorrt) instead of the one this device resolves "
                                    "(default: $ONNXCAST_EDGE_TARGET, else resolved; docs/targets.md)")
    p.set_defaults(handler=run_edge_pull)

    p = commands.add_parser("status", help="what DEST serves: version, channel, artifact, the deployment target "
                                           "and why it was chosen (JSON)")
    p.add_argument("--dir", required=True, help="device folder given to 'pull --dest'")
    p.set_defaults(handler=run_edge_status)

    p = commands.add_parser("predict", help="forecast from a CSV with the installed model: CSV on stdout, "
                                            "step, time, forecast, one q<level> column per quantile level of the "
                                            "model (none for a model without quantiles), version")
    p.add_argument("--dir", required=True, help="device folder given to 'pull --dest'")
    p.add_argument("--input", required=True, help="CSV with the time, target and feature columns")
    p.add_argument("--time-column", default="ds",
                   help="column of timestamps (ISO 8601); the forecast's times follow its last value (default ds)")
    p.add_argument("--series-column", metavar="ID",
                   help="the input is a long table of many series (a fleet, for a global model): forecast each "
                        "series named in this column from its own newest rows, in batches")
    p.add_argument("--min-rows", type=int, metavar="N",
                   help="with --series-column: fewest rows a series needs (default: the model's season); "
                        "shorter series than the lookback are edge-padded with their first row")
    p.set_defaults(handler=run_edge_predict)

    p = commands.add_parser("trust", help="install a trust root into a device folder (once per device)")
    p.add_argument("--dest", required=True, help="device folder")
    p.add_argument("--root", required=True,
                   help=f"root.json from '{keys_command('generate')}' or '{keys_command('root')}'")
    p.add_argument("--replace", action="store_true", help="replace a newer installed root")
    p.set_defaults(handler=run_edge_trust)


def edge_main(argv: list[str] | None = None) -> int:
    """``onnxcast-edge``: the device commands (``pull``, ``predict``, ``trust``, ``keys``; ``edge
    pull`` etc. still work), light imports only. The hints name ``onnxcast-edge`` while it runs,
    and the program the process had again after (a caller in the same process, as a test is,
    keeps its own name in later hints)."""
    previous = program()
    use_program(DEVICE_PROGRAM)  # hints name onnxcast-edge, the command this device has
    try:
        return _edge_main(argv)
    finally:
        use_program(previous)


def _edge_main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=DEVICE_PROGRAM, description="onnxcast device client: pull signed "
                                     "models from a rollout store, verify them and run them")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{pull,predict,status,trust,keys}")
    add_device_commands(commands)
    add_keys_commands(commands)
    # `onnxcast-edge edge pull`: the spelling of the first release, kept working
    add_edge_commands(commands, help="the same commands as 'onnxcast edge ...' spells them")
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, usage errors: flush here, where a closed pipe is caught
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _silence_stdout()
        raise
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()
        return code
    except (ConfigError, DataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OnnxcastError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`onnxcast-edge predict ... | head`): not an error
        _silence_stdout()
        return 0


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again


# --- handlers -----------------------------------------------------------------------------

def run_keys_generate(args: argparse.Namespace) -> int:
    files = generate_key(args.out, root_days=args.root_expires_days)
    print(f"wrote {files['private']} (private, mode 0600: keep it off workers), {files['public']} and "
          f"{files['root']} (install on devices: {device_command('trust --dest DEST --root ' + str(files['root']))})")
    return 0


def run_keys_root(args: argparse.Namespace) -> int:
    from pathlib import Path

    version = 1
    if args.previous:
        previous = Path(args.previous)
        version = parse_root(_read_root_file(previous), str(previous)).signed.version + 1
    root = make_root([read_public_key(k) for k in args.root_key], [read_public_key(k) for k in args.release_key],
                     root_threshold=args.root_threshold, release_threshold=args.release_threshold,
                     version=version, expires_days=args.expires_days)
    out = Path(args.out)
    out.write_bytes(sign_root(root, load_signers(args.sign_with, option="--sign-with", from_env=False)))
    print(f"wrote {out}: root version {version}, root {args.root_threshold} of {len(set(args.root_key))} key(s), "
          f"release {args.release_threshold} of {len(set(args.release_key))} key(s)")
    return 0


def run_keys_publish_root(args: argparse.Namespace) -> int:
    from pathlib import Path

    path = Path(args.root)
    data = _read_root_file(path)
    root = parse_root(data, str(path))
    verify_self_signed(root, str(path))
    store = open_store(args.store)
    version = root.signed.version
    key = store.root_key(version)
    if version > 1:
        # Devices walk the chain one version at a time and writers refuse a gap: root N is
        # published only on top of root N-1, and only if it chains from it (a root that skips
        # a revoked key's root would otherwise hide the revocation from writers).
        previous_key = store.root_key(version - 1)
        previous_data = store.read_bounded(previous_key, MAX_ROOT_BYTES)
        if previous_data is None:
            raise ConfigError(f"{store.url(previous_key)}: not published; publish root {version - 1} first "
                              f"('{keys_command('publish-root')} --store {args.store} --root FILE'), "
                              "nothing written")
        previous = parse_root(previous_data, store.url(previous_key))
        try:
            verify_next_root(previous, root, str(path))
        except RefusedError as exc:
            raise ConfigError(f"{exc.args[0].removesuffix('; refusing it')} (the published root {version - 1}); "
                              "devices would refuse it, nothing written") from None
    if not store.create(key, data) and store.read(key) != data:
        raise ConfigError(f"{store.url(key)}: a different root version {root.signed.version} is already published")
    print(f"published root version {root.signed.version} at {store.url(key)}")
    return 0


def run_keys_kms_pub(args: argparse.Namespace) -> int:
    out = write_public_key(args.out, kms_signer(args.key_id))
    print(f"wrote {out} (public key of KMS key {args.key_id})")
    return 0


def run_edge_pull(args: argparse.Namespace) -> int:
    from onnxcast.rollout.edge import pull, watch

    if args.watch:
        check_interval(args.interval)  # before the first poll: `nan` used to crash after it
        if args.max_polls is not None and args.max_polls < 1:
            raise ConfigError(f"--max-polls must be >= 1, got {args.max_polls}")
        try:
            failures = watch(args.store, args.model, args.channel, args.dest, interval=args.interval,
                             max_polls=args.max_polls, trust=args.trust, on_poll=lambda line: print(line, flush=True),
                             target=args.target)
        except KeyboardInterrupt:  # the usual way to stop an unbounded watch
            return 130
        return 1 if failures else 0
    result = pull(args.store, args.model, args.channel, args.dest, trust=args.trust, target=args.target)
    state = "installed" if result.changed else "already at"
    target = f"; target {result.target} ({result.why})" if result.target else ""
    print(f"{result.model} channel {result.channel}: {state} version {result.version} ({result.path}){target}")
    return 0


def run_edge_status(args: argparse.Namespace) -> int:
    """pulled.json of the version DEST serves (its sha256 checked), as JSON on stdout."""
    from onnxcast.rollout.edge import installed

    path, info = installed(args.dir)
    shown = {k: v for k, v in info.items() if not k.startswith("_")}
    print(json.dumps({"path": str(path), **shown}, indent=2))
    return 0


def check_interval(seconds: float) -> float:
    """A watch interval: finite, 0 to MAX_INTERVAL_S seconds (``--interval nan`` or ``inf``
    made ``time.sleep`` raise after the first poll)."""
    from onnxcast.rollout.edge import MAX_INTERVAL_S

    if not 0 <= seconds <= MAX_INTERVAL_S:  # False for nan too
        raise ConfigError(f"--interval must be between 0 and {MAX_INTERVAL_S:,} seconds (a day), got {seconds!r}")
    return seconds


def run_edge_predict(args: argparse.Namespace) -> int:
    from onnxcast.rollout.edge import predict

    if args.series_column is None and args.min_rows is not None:
        raise ConfigError("--min-rows applies to a fleet input: add --series-column")
    if args.series_column is not None and args.series_column == args.time_column:
        raise ConfigError(f"--series-column and --time-column are both {args.series_column!r}; "
                          "a fleet table needs one column of each")
    predict(args.dir, args.input, out=sys.stdout, time_column=args.time_column, series_column=args.series_column,
            min_rows=args.min_rows)
    return 0


def run_edge_trust(args: argparse.Namespace) -> int:
    version = install_trust(args.dest, args.root, replace=args.replace)
    print(f"{args.dest}: trusts root version {version} from {args.root}")
    return 0


def _read_root_file(path) -> bytes:
    """A trust root file the user names: a regular file of at most 1 MiB."""
    try:
        return read_regular_file(path, what="trust root", limit=MAX_ROOT_BYTES)
    except UntrustedInputError as exc:
        raise ConfigError(f"{exc}; cannot read the trust root") from None


def store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", required=True, help="rollout store: a folder or s3://bucket/prefix")
    parser.add_argument("--model", required=True, help="model name in the store")
