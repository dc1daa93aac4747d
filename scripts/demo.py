"""Run the onnxcast_training DAG end to end on the embedded defaults, then say where things are.

Everything lives under ONNXCAST_HOME (default ./.onnxcast): Airflow's SQLite DB, MLflow's
SQLite store and artifacts, the run directories and the rollout store. The DAG runs with
Airflow's own ``dag.test()``: a real DAG run (scheduler dependency logic, XCom, mapped
tasks, asset events) in this one process, no scheduler or executor to start.

The terminal shows a live table of task states (plain state-change lines when not on a
terminal) and the summary; Airflow's and the tasks' logs go to
``$ONNXCAST_HOME/logs/demo-<time>.log``, whose path is printed at the start and the end.

    .venv/bin/python scripts/demo.py                 # about 3-4 minutes on 2 cores
    .venv/bin/python scripts/demo.py --quick         # the two fast families, fewer epochs: about 1-2 minutes
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))
import airflow_env  # noqa: E402  (must configure the environment before airflow is imported)
from demo_output import TaskStatesView, output_to  # noqa: E402

DEMO_SETTINGS = {
    "data_uri": "example",
    # N-HiTS and DLinear anchor on the daily and weekly seasonal naive and train in seconds; the
    # LSTM shows a classic family next to them (the Transformer is slower: add it with --families)
    "families": ["nhits", "dlinear", "lstm"],
    "horizon": 24,
    "lookback": 168,
    "max_epochs": 12,
    "channels": ["edge", "cloud"],
    "model_name": "onnxcast-forecaster",
    "extra_settings": {"latency_repeats": 20},
}
QUICK_SETTINGS = {  # a week of history still: the weekly seasonal naive is the baseline to beat
    **DEMO_SETTINGS,
    "families": ["nhits", "dlinear"],
    "max_epochs": 6,
    "extra_settings": {"latency_repeats": 5},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the two fast families (N-HiTS, DLinear) and fewer epochs")
    parser.add_argument("--epochs", type=int, help="training epochs at most")
    parser.add_argument("--families", help="comma-separated: lstm,transformer")
    parser.add_argument("--home", help="ONNXCAST_HOME (default: $ONNXCAST_HOME or ./.onnxcast)")
    args = parser.parse_args(argv)

    env = airflow_env.configure(args.home)
    conf = dict(QUICK_SETTINGS if args.quick else DEMO_SETTINGS)
    if args.epochs:
        conf["max_epochs"] = args.epochs
    if args.families:
        conf["families"] = [f.strip() for f in args.families.split(",") if f.strip()]
    home = Path(env["ONNXCAST_HOME"])
    log_path = home / "logs" / f"demo-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.log"
    print(f"ONNXCAST_HOME={home}")
    print(f"Airflow and task logs: {log_path}", flush=True)
    with output_to(log_path) as terminal:
        return run_demo(conf, home, log_path, terminal)


def run_demo(conf: dict, home: Path, log_path: Path, terminal: TextIO) -> int:
    """Run the DAG while showing its task states on ``terminal``; everything else goes to the log."""
    print("Preparing the Airflow metadata DB (SQLite) ...", file=terminal)
    airflow_env.init_db()

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(airflow_env.REPO / "dags"))
    if bag.import_errors:
        for path, error in bag.import_errors.items():
            print(f"error: {path}: {error}", file=terminal)
        return 1
    dag = bag.get_dag("onnxcast_training")
    print(f"Running onnxcast_training with {json.dumps(conf)}", file=terminal)
    started = time.monotonic()
    from airflow.sdk.exceptions import ParamValidationError

    try:
        with TaskStatesView(dag.dag_id, list(dag.task_dict), terminal, log_path, mapped_over="merge_data"):
            run = dag.test(run_conf=conf)
    except ParamValidationError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=terminal)
        return 2
    wall = time.monotonic() - started
    return report(run, conf, home, wall, log_path, terminal)


def report(run, conf: dict, home: Path, wall: float, log_path: Path, out: TextIO) -> int:
    """Where to look: run state, validation summary, MLflow, rollout store, the log file."""
    from collections import Counter

    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from onnxcast.registry.tracking import CHALLENGER, CHAMPION, alias_version, default_tracking_uri

    def say(text: str = "") -> None:
        print(text, file=out)

    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == run.dag_id,
                                                         TaskInstance.run_id == run.run_id)).all()
        xcom_run_dir = session.scalar(select(XComModel.value).where(
            XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id,
            XComModel.task_id == "check_data", XComModel.key == "run_dir"))
        states = Counter(str(getattr(ti.state, "value", ti.state)) for ti in tis)
    run_state = str(getattr(run.state, "value", run.state))
    counts = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    say(f"\nDAG run {run.run_id}: {run_state} in {wall:.0f} s ({len(tis)} tasks: {counts})")

    run_dir = Path(str(xcom_run_dir or ""))
    if xcom_run_dir and (run_dir / "report.json").exists():
        from onnxcast.cli import summarize_report

        say(f"\nValidation ({run_dir})")
        say("  " + summarize_report(json.loads((run_dir / "report.json").read_text()), str(run_dir)).replace("\n", "\n  "))

    name = conf["model_name"]
    uri = default_tracking_uri()
    champion, challenger = alias_version(name, CHAMPION, uri), alias_version(name, CHALLENGER, uri)
    store = home / "rollout" / name
    say("\nMLflow")
    say(f"  tracking URI : {uri}")
    say(f"  UI           : .venv/bin/mlflow ui --backend-store-uri {uri} --port 5000   (then http://127.0.0.1:5000)")
    say(f"  registry     : models:/{name}@{CHAMPION} -> version {champion}; @{CHALLENGER} -> version {challenger}")
    say("Rollout store")
    for channel in conf["channels"]:
        pointer = store / "channels" / f"{channel}.json"
        if pointer.exists():
            value = json.loads(pointer.read_text()).get("signed") or {}  # a signed envelope
            say(f"  {channel:<5}: version {value['version']} {value['artifact']}  ({pointer})")
    if champion:
        say(f"  manifest     : {store / 'versions' / champion / 'manifest.json'}")
    if (home / "keys" / "root.json").exists():  # the development release key of the embedded mode
        say(f"  device       : .venv/bin/onnxcast edge pull --store {home / 'rollout'} --model {name} "
            f"--channel edge --dest {home / 'device'} --trust {home / 'keys' / 'root.json'}")
    say("Airflow UI     : make airflow   (then http://127.0.0.1:8080, DAG onnxcast_training)")
    say(f"Airflow and task logs: {log_path}")
    return 0 if run_state == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
