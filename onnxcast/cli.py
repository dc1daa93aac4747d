"""The onnxcast command line.

Exit codes: 0 success, 2 bad settings or data (one ``error:`` line on stderr, no traceback),
3 a validation gate failed, 1 any other onnxcast error.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from onnxcast import __version__
from onnxcast.base.errors import ConfigError, DataError, DataQualityError, GateError, OnnxcastError
from onnxcast.pipeline.config import PipelineConfig, Setting, data_source, settings
from onnxcast.pipeline.judging import ACROSS_SERIES, report_judging
from onnxcast.registry.monitoring import monitor_channel
from onnxcast.registry.release import (
    NO_REGISTRY,
    promote,
    refresh,
    registry_from_environment,
    rollback,
)
from onnxcast.rollout.cli import add_edge_commands, add_keys_commands, store_arguments
from onnxcast.serving.cli import add_serve_command

log = logging.getLogger("onnxcast")


def main(argv: list[str] | None = None) -> int:
    previous = _exit_on_sigterm()
    try:
        return _run(argv)
    except BrokenPipeError:  # the reader went away (`onnxcast edge predict ... | head`): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm():
    """On SIGTERM (``timeout``, Kubernetes, systemd) tidy the pipeline runs in progress as a
    failure does (their ``.staging`` removed, the quality report kept), say so, and exit with
    128 + 15. Python's default dies at once (a killed run left 151 MB of staging), and an
    exception raised from the handler can be lost in C code (it was, inside ``compile``
    importing a module), so the handler tidies and exits itself. Returns the handler it
    replaced (None: not the main thread)."""
    def terminated(signum, frame):
        signal.signal(signum, signal.SIG_IGN)  # a second signal must not stop the tidying half-way
        print("error: terminated (SIGTERM)", file=sys.stderr, flush=True)
        run = sys.modules.get("onnxcast.pipeline.run")
        if run is not None:
            run.abandon_runs()
        os._exit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: leave signals to whoever owns it
        return None


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, usage errors: flush here, where a closed pipe is caught
        sys.stdout.flush()
        raise
    _configure_logging(args.verbose)
    try:
        code = int(args.handler(args) or 0)
        sys.stdout.flush()
        return code
    except (ConfigError, DataError) as exc:
        _print_error(exc)
        return 2
    except GateError as exc:
        _print_error(exc)
        return 3
    except OnnxcastError as exc:
        _print_error(exc)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


class _Parser(argparse.ArgumentParser):
    """argparse's parser, except that a failed write of --help or --version is not swallowed:
    argparse ignores an OSError there, so a help text longer than stdout's buffer (8 KiB:
    `onnxcast pipeline --help` is 8.4 KB) went out as a bare SystemExit past ``main``'s
    BrokenPipeError handling (`onnxcast pipeline --help | head`)."""

    def _print_message(self, message: str, file=None) -> None:
        if message:
            (file or sys.stderr).write(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onnxcast", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("pipeline", help="check data, train, export, optimize and validate",
                            description="Run the whole pipeline and write DIR/report.json and the ONNX files.",
                            formatter_class=_DefaultsHelp)
    add_settings_arguments(p)
    p.set_defaults(handler=run_pipeline_command)

    add_release_commands(commands)
    add_monitor_command(commands)

    add_serve_command(commands)
    return parser


class _DefaultsHelp(argparse.HelpFormatter):
    """Show an option's default in its help, unless it has none (required, or derived)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default in (None, False, "", argparse.SUPPRESS) or "%(default)" in text:
            return text
        return text + " (default: %(default)s)"


def add_settings_arguments(parser: argparse.ArgumentParser, cls: type = PipelineConfig) -> None:
    """One option per setting of ``cls`` that has one (``cli`` of onnxcast.pipeline.config.setting),
    group by group (in the order the groups first appear), those without a group last."""
    groups: dict[str | None, list[Setting]] = {}
    for s in settings(cls):
        if s.cli:
            groups.setdefault(s.group, []).append(s)
    for title, members in sorted(groups.items(), key=lambda item: item[0] is None):
        target = parser.add_argument_group(title) if title else parser
        for s in members:
            _add_setting(target, s)


def _add_setting(parser: argparse.ArgumentParser | argparse._ArgumentGroup, s: Setting) -> None:
    text = s.help.replace("%", "%%")
    if s.kind is bool:
        if s.default is not False:
            raise TypeError(f"{s.name}: a command-line switch turns a setting on; its default must be False")
        parser.add_argument(s.cli, action="store_true", help=text)
        return
    options: dict[str, Any] = {"required": True} if s.required else {
        "default": ",".join(s.default) if s.kind is tuple else s.default}
    if s.kind in (int, float):
        options["type"] = s.kind
    if s.metavar:
        options["metavar"] = s.metavar
    parser.add_argument(s.cli, help=text, **options)


def settings_from_args(args: argparse.Namespace, cls: type = PipelineConfig) -> dict[str, Any]:
    """The settings the options of :func:`add_settings_arguments` parsed, as
    :meth:`PipelineConfig.from_dict` takes them (``{"quality": {...}}`` for the nested ones)."""
    values: dict[str, Any] = {}
    for s in settings(cls):
        if s.cli:
            *parent, name = s.name.split(".")
            into = values.setdefault(parent[0], {}) if parent else values
            into[name] = getattr(args, s.cli.lstrip("-").replace("-", "_"))
    return values


def run_pipeline_command(args: argparse.Namespace) -> int:
    from onnxcast.pipeline.run import run_pipeline
    from onnxcast.targets.step import validate_on_target

    values = settings_from_args(args)
    values["data_uri"] = data_source(values["data_uri"])
    cfg = PipelineConfig.from_dict(values)
    report = run_pipeline(cfg, target_step=validate_on_target)
    print(summarize_report(report, args.out))
    return 0


def summarize_report(report: dict, out: str) -> str:
    """A short human summary of report.json for the terminal (the CLI and the demo)."""
    if report_judging(report) == ACROSS_SERIES:
        return summarize_fleet_report(report, out)
    baselines = report["baselines"]
    base = baselines["seasonal_naive"]
    origins = baselines.get("origins") or {}
    lines = [f"report: {Path(out) / 'report.json'}"]  # not "out//report.json" for --out out/
    if origins:
        lines.append(f"holdout: {origins['count']} forecast origins, one every {origins['stride']} steps "
                     "(every phase of the season); MAE with its 95% interval")
    for name, row in (baselines.get("candidates") or {"seasonal_naive": base}).items():
        best = name == baselines.get("best") or not baselines.get("candidates")
        mark = "  <- the baseline to beat" if name == baselines.get("best") else ""
        # the best baseline's intervals (split-conformal, calibrated as the models') are on seasonal_naive
        bands = _intervals(row.get("intervals") or (base.get("intervals") if best else None))
        lines.append(f"  {name:<20} MAE {_mae(row)}  MASE {row['mase']:.3f}{bands}{mark}")
    reference = report.get("reference")
    if reference:
        lines.append(f"  reference {reference['model']}: MAE {_mae(reference)}  MASE {reference['mase']:.3f}"
                     f"{_intervals(reference.get('intervals'))}")
    for m in report["models"]:
        t = m["torch"]
        status = "" if m.get("gates_passed", True) else "  EXCLUDED: " + "; ".join(m.get("failures", []))
        vs = m.get("fp32_vs") or {}
        versus = "".join(f", x{c['mae_ratio']:.2f} of {name} (p={_p(c)})" for name, c in vs.items() if c.get("mae_ratio"))
        lines.append(f"{m['family']}: torch MAE {_mae(t['holdout'])}{versus}, batch1 p50 "
                     f"{t['latency_ms']['batch1_p50']:.2f} ms{status}")
        lines += _interval_verdict(m.get("intervals"))
        for v in m["variants"]:
            h = v["holdout"] or {}
            speed = v.get("speedup_vs_torch", {})
            lines.append(f"  {v['name']:<8} MAE {h.get('mae', float('nan')):.4g}{_intervals(h.get('intervals'))}"
                         f"  size {v['size_bytes'] / 1024:.0f} KiB  "
                         f"b1 x{speed.get('batch1_p50', float('nan')):.2f}  b64 x{speed.get('batch64_p50', float('nan')):.2f}  "
                         f"{'eligible' if v['eligible'] else 'not eligible: ' + '; '.join(v['reasons'])}")
    choice = report.get("family_choice") or {}
    if len(choice.get("tied_with_best") or []) > 1:
        lines.append(f"families not significantly different from {choice['best']}: "
                     f"{', '.join(choice['tied_with_best'][1:])} (chosen by speed among them)")
    for channel, pick in report["selected"].items():
        lines.append(f"selected for {channel}: {pick['family']} {pick['variant']}{_targets_text(pick)}")
    return "\n".join(lines)


def _targets_text(pick: dict) -> str:
    """A channel's deployment targets for the summary: the variant it runs on each, those missing."""
    runs = ", ".join(f"{name} {choice['variant']}" for name, choice in (pick.get("targets") or {}).items())
    missing = ", ".join(pick.get("targets_missing") or {})
    return (f"; targets: {runs or 'none'}" if runs or missing else "") + (f" (not on {missing})" if missing else "")


def summarize_fleet_report(report: dict, out: str) -> str:
    """The summary of a fleet run: series kept, excluded (and why) and padded; per family the
    fp32 mean MASE over series with its interval, against the best naive and AutoETS."""
    fleet = report["fleet"]
    lines = [f"report: {Path(out) / 'report.json'}"]
    excluded = fleet.get("excluded")
    reasons = ""
    if isinstance(excluded, list) and excluded:
        from collections import Counter

        why = Counter(str(e.get("because", "?")) if isinstance(e, dict) else "?" for e in excluded)
        reasons = " (" + ", ".join(f"{n} {because}" for because, n in why.most_common()) + ")"
    lines.append(f"fleet: {_count(fleet.get('n_series'))} series kept, {_count(excluded)} excluded{reasons}, "
                 f"{_count(fleet.get('padded'))} padded (shorter than the lookback); mean MASE over series "
                 "with its 95% interval")
    reference = fleet.get("reference") or {}
    aggregates = {"best naive": (fleet.get("baselines") or {}).get("best_naive") or {},
                  **(reference.get("aggregates") or {})}
    if reference.get("sampled"):
        lines.append(f"  reference on a random sample of {reference.get('sample_size')} series")
    for name, row in aggregates.items():
        if row:
            lines.append(f"  {name:<20} MASE {_mase(row)}  sMAPE {row.get('smape_mean', float('nan')):.4g}"
                         f"{_intervals(row.get('intervals'))}")
    bars = {"best naive": aggregates["best naive"], "AutoETS": aggregates.get("AutoETS") or {}}
    tests = fleet.get("tests") or {}
    for m in report["models"]:
        family = m["family"]
        variants = (fleet.get("families") or {}).get(family) or {}
        fp32 = variants.get("fp32") or {}
        versus = "".join(f", vs {name} {row['mase_mean']:.4g} (x{fp32['mase_mean'] / row['mase_mean']:.2f}"
                         f"{_p_of(tests.get(family), name)})"
                         for name, row in bars.items() if row.get("mase_mean") and fp32.get("mase_mean") is not None)
        loses = f"; loses to the best naive on {fp32['loses_share']:.0%} of series" \
            if isinstance(fp32.get("loses_share"), int | float) else ""
        status = "" if m.get("gates_passed", True) else "  EXCLUDED: " + "; ".join(m.get("failures", []))
        lines.append(f"{family}: fp32 MASE {_mase(fp32) if fp32 else 'n/a'}{versus}{loses}{status}")
        lines += _interval_verdict(m.get("intervals"))
        for v in m.get("variants", []):
            row = variants.get(v["name"]) or {}
            bands = _intervals(row.get("intervals") or (v.get("holdout") or {}).get("intervals"))
            lines.append(f"  {v['name']:<8} MASE {row.get('mase_mean', float('nan')):.4g}{bands}  "
                         f"size {v['size_bytes'] / 1024:.0f} KiB  "
                         f"{'eligible' if v.get('eligible') else 'not eligible: ' + '; '.join(v.get('reasons', []))}")
    for channel, pick in (report.get("selected") or {}).items():
        lines.append(f"selected for {channel}: {pick['family']} {pick['variant']}")
    return "\n".join(lines)


def _intervals(figures: dict | None) -> str:
    """``  80%/95% cover 79.2%/94.1%  MSIS 5.12`` (the 95% interval's; a fleet: means over
    series), or nothing for a report from before forecast distributions."""
    figures = figures or {}
    numbers = [figures.get(k) for k in ("coverage_80", "coverage_95", "msis_95")]
    if not any(isinstance(n, int | float) for n in numbers):
        return ""
    c80, c95, msis = (f"{n:{spec}}" if isinstance(n, int | float) else "n/a"
                      for n, spec in zip(numbers, (".1%", ".1%", ".4g"), strict=True))
    return f"  80%/95% cover {c80}/{c95}  MSIS {msis}"


def _interval_verdict(verdict: dict | None) -> list[str]:
    """``  intervals not judged: 2 independent holdout window(s) ...`` for a family whose
    intervals are not plainly calibrated (validate.interval_verdict); nothing otherwise."""
    if not verdict or verdict.get("status") in (None, "calibrated"):
        return []
    status = verdict["status"]
    if status in ("uncalibrated", "refused"):
        why = "; ".join(verdict.get("missed") or [])
        action = ("shipped marked uncalibrated (--strict-intervals refuses them)" if status == "uncalibrated"
                  else "the family is refused (--strict-intervals)")
        return [f"  intervals: {status}: {why}: {action}"]
    return [f"  intervals: {verdict.get('note') or status}"]


def _count(value: Any) -> str:
    if isinstance(value, list | tuple | dict):
        return f"{len(value):,}"
    return "?" if value is None else f"{int(value):,}"


def _mase(row: dict) -> str:
    interval = row.get("mase_ci95")
    text = f"{row.get('mase_mean', float('nan')):.4g}"
    if interval and all(v is not None and v == v for v in interval):
        text += f" [{interval[0]:.4g}, {interval[1]:.4g}]"
    return text


def _p_of(tests: dict | None, name: str) -> str:
    """The p of the family's paired test across series against ``name`` ('best naive', a reference)."""
    tests = tests or {}
    test = tests.get("vs_best_naive") if name == "best naive" else (tests.get("vs_reference") or {}).get(name)
    return f", p={_p(test)}" if test else ""


def _mae(row: dict) -> str:
    interval = row.get("mae_ci95")
    if interval and all(v == v for v in interval):  # not NaN
        return f"{row['mae']:.4g} [{interval[0]:.4g}, {interval[1]:.4g}]"
    return f"{row['mae']:.4g}"


def _p(test: dict) -> str:
    return "n/a" if test.get("p_value") is None else f"{test['p_value']:.2g}"


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger("onnxcast").setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("torch.onnx", "onnxscript", "onnx_ir"):
        logging.getLogger(noisy).setLevel(logging.ERROR)


def _print_error(exc: BaseException) -> None:
    if isinstance(exc, DataQualityError):  # a header, then one line per failed check
        where = f" (report: {exc.report_path})" if exc.report_path else ""
        print(f"error: {exc.source}: {len(exc.failures)} data check(s) failed{where}", file=sys.stderr)
        for failure in exc.failures:
            print(f"  - {' '.join(failure.split())}", file=sys.stderr)
        return
    message = " ".join(str(exc).split())  # one line, whatever the exception held
    print(f"error: {message}", file=sys.stderr)


# --- monitor: accuracy in production -------------------------------------------------------

def add_monitor_command(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "monitor", help="judge the model a channel serves on the data since it was trained",
        description="Pull the channel's model from the rollout store as a device does, forecast the data after "
                    "its trained_until, and compare the realised MASE with the holdout's (one-sided test) and "
                    "the inputs with the training window (drift). Exit status 4 when degraded or drifted.")
    p.add_argument("--store", required=True, help="rollout store: a folder or s3://bucket/prefix")
    p.add_argument("--model", required=True, help="model name (in the store and the MLflow registry)")
    p.add_argument("--channel", required=True, help="channel whose served version is judged")
    p.add_argument("--trust", help="trust root file the pull verifies with (default: $ONNXCAST_TRUST)")
    p.add_argument("--data", help="data to judge on (default: the version's own dataset, from its verified report; "
                                  "a local path there is read only inside $ONNXCAST_HOME or a folder of "
                                  "$ONNXCAST_DATA_ROOTS)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else the embedded store)")
    p.add_argument("--no-log", action="store_true", help="record nothing in MLflow (no monitor run, no version tag)")
    p.set_defaults(handler=run_monitor)


def run_monitor(args: argparse.Namespace) -> int:
    import json

    summary = monitor_channel(args.model, args.channel, args.store, trust=args.trust, data_uri=args.data,
                              tracking_uri=args.tracking_uri, log_to_mlflow=not args.no_log)
    shown = {k: v for k, v in summary.items() if k != "conf"}
    print(json.dumps(shown, sort_keys=True))
    for line in summary["reasons"]:
        print(f"retrain: {line}", file=sys.stderr)
    return 4 if summary["reasons"] else 0


# --- release commands: promote, rollback, refresh ------------------------------------------

def add_release_commands(subparsers: argparse._SubParsersAction) -> None:
    """Register the release commands (``promote``, ``rollback``, ``refresh``) and the device's
    (``keys``, ``edge``) on ``subparsers``. A promotion or rollback moves the channel pointer and,
    with a registry configured, the registry aliases with it (onnxcast.registry.release)."""
    p = subparsers.add_parser("promote", help="publish a validated run to the rollout store and move channels")
    p.add_argument("--report", required=True, help="report.json of a pipeline run (or its folder)")
    store_arguments(p)
    p.add_argument("--channel", required=True, action="append",
                   help="channel to move (repeat or comma-separate: edge,cloud)")
    p.add_argument("--version", help="version id (default: the MLflow version, else derived from the content)")
    p.add_argument("--actor", help="who promotes (default: $ONNXCAST_ACTOR or user@host)")
    p.add_argument("--reason", default="", help="why, recorded in the channel history")
    p.add_argument("--overwrite-unverified-pointer", action="store_true",
                   help="move a channel whose current pointer does not verify (planted or damaged) to --version; "
                        "nothing of that pointer is kept")
    _signing_arguments(p)
    _registry_arguments(p)
    p.set_defaults(handler=run_promote)

    p = subparsers.add_parser("rollback", help="move a channel back to an earlier version (a signed rollback record)")
    store_arguments(p)
    p.add_argument("--channel", required=True, help="channel to move back (edge or cloud)")
    p.add_argument("--to", dest="to_version", help="version to move to (default: the one before the current)")
    p.add_argument("--reason", required=True, help="why, recorded in the channel history")
    p.add_argument("--actor", help="who rolls back (default: $ONNXCAST_ACTOR or user@host)")
    _signing_arguments(p)
    _registry_arguments(p)
    p.set_defaults(handler=run_rollback)

    p = subparsers.add_parser("refresh", help="re-sign a channel pointer (new counter and expiry, same version)")
    store_arguments(p)
    p.add_argument("--channel", required=True, help="channel whose pointer to re-sign (edge or cloud)")
    _signing_arguments(p)
    p.set_defaults(handler=run_refresh)

    add_keys_commands(subparsers)
    add_edge_commands(subparsers)


def run_promote(args: argparse.Namespace) -> int:
    registry, why = _release_registry(args)
    result = promote(args.report, args.store, args.model, args.channel, registry=registry, version=args.version,
                     move_champion=not args.keep_champion, actor=args.actor, reason=args.reason,
                     signers=args.signing_key, expires_days=args.expires_days,
                     overwrite_unverified=args.overwrite_unverified_pointer, no_registry=why)
    print(result.line())
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    registry, why = _release_registry(args)
    result = rollback(args.store, args.model, args.channel, registry=registry, to_version=args.to_version,
                      move_champion=not args.keep_champion, actor=args.actor, reason=args.reason,
                      signers=args.signing_key, expires_days=args.expires_days, no_registry=why)
    print(result.line())
    return 0


def run_refresh(args: argparse.Namespace) -> int:
    print(refresh(args.store, args.model, args.channel, signers=args.signing_key,
                  expires_days=args.expires_days).line())
    return 0


def _release_registry(args: argparse.Namespace):
    """The registry a release keeps in step (None: pointer only) and what to say without one."""
    if args.pointer_only:
        return None, ("--pointer-only: the registry aliases were not moved; an alias watcher that reads them "
                      "will move the channel back unless they are moved too")
    return registry_from_environment(args.tracking_uri), NO_REGISTRY


def _registry_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "registry", "With a registry (--tracking-uri or $MLFLOW_TRACKING_URI; its login in $MLFLOW_TRACKING_USERNAME "
                    "and $MLFLOW_TRACKING_PASSWORD), the aliases champion and the channel's own "
                    "($ONNXCAST_CHANNEL_ALIASES, default edge=edge,cloud=cloud) move with the pointer, or nothing "
                    "moves; without one, only the pointer moves (said in the output).")
    group.add_argument("--tracking-uri", help="MLflow tracking server (default: $MLFLOW_TRACKING_URI)")
    group.add_argument("--keep-champion", action="store_true",
                       help="leave the alias champion where it is (the channel's own alias still moves)")
    group.add_argument("--pointer-only", action="store_true",
                       help="move the channel pointer only, not the registry aliases (the registry is down in an "
                            "incident; an alias watcher will move the channel back unless the aliases follow)")


def _signing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--signing-key", action="append",
                        help="release key: a private key file or awskms:KEY (repeat for a threshold; "
                             "default $ONNXCAST_SIGNING_KEY)")
    parser.add_argument("--expires-days", type=float,
                        help="days the channel pointer stays valid (default $ONNXCAST_POINTER_EXPIRES_DAYS or 30)")


if __name__ == "__main__":
    sys.exit(main())
