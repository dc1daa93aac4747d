"""Run the onnxcast_training DAG end to end on the embedded defaults, then say where things are.

Everything lives under ONNXCAST_HOME (default ./.onnxcast): Airflow's SQLite DB, MLflow's
SQLite store and artifacts, the run directories and the rollout store. The DAG runs with
Airflow's own ``dag.test()``: a real DAG run (scheduler dependency logic, XCom, mapped
tasks, asset events) in this one process, no scheduler or executor to start.

    .venv/bin/python scripts/demo.py                 # about 3-4 minutes on 2 cores
    .venv/bin/python scripts/demo.py --quick         # tiny models, about 1-2 minutes
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import airflow_env  # noqa: E402  (must configure the environment before airflow is imported)

DEMO_SETTINGS = {
    "data_uri": "example",
    "families": ["lstm", "transformer"],
    "horizon": 24,
    "lookback": 168,
    "max_epochs": 8,
    "channels": ["edge", "cloud"],
    "model_name": "onnxcast-forecaster",
    "extra_settings": {"latency_repeats": 20},
}
QUICK_SETTINGS = {
    **DEMO_SETTINGS,
    "lookback": 48,
    "horizon": 12,
    "max_epochs": 3,
    "extra_settings": {"hidden_size": 16, "num_layers": 1, "d_model": 16, "n_heads": 2, "latency_repeats": 5},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models and short windows")
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
    print(f"ONNXCAST_HOME={home}")
    print("Preparing the Airflow metadata DB (SQLite) ...", flush=True)
    airflow_env.init_db()
    logging.getLogger("airflow").setLevel(logging.WARNING)

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(airflow_env.REPO / "dags"))
    if bag.import_errors:
        for path, error in bag.import_errors.items():
            print(f"error: {path}: {error}", file=sys.stderr)
        return 1
    dag = bag.get_dag("onnxcast_training")
    print(f"Running onnxcast_training with {json.dumps(conf)}", flush=True)
    started = time.monotonic()
    run = dag.test(run_conf=conf)
    wall = time.monotonic() - started
    return report(run, conf, home, wall)


def report(run, conf: dict, home: Path, wall: float) -> int:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from onnxcast.tracking import CHALLENGER, CHAMPION, alias_version, default_tracking_uri

    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == run.dag_id,
                                                         TaskInstance.run_id == run.run_id)).all()
        xcom_run_dir = session.scalar(select(XComModel.value).where(
            XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id,
            XComModel.task_id == "check_data", XComModel.key == "run_dir"))
        states = sorted((ti.task_id, ti.map_index, str(ti.state),
                         (ti.end_date - ti.start_date).total_seconds() if ti.end_date and ti.start_date else 0.0)
                        for ti in tis)
    print(f"\nDAG run {run.run_id}: {run.state} in {wall:.0f} s")
    for task_id, index, state, duration in states:
        label = task_id if index < 0 else f"{task_id}[{index}]"
        print(f"  {label:<26} {state:<10} {duration:6.1f} s")

    run_dir = Path(str(xcom_run_dir or ""))
    if xcom_run_dir and (run_dir / "report.json").exists():
        from onnxcast.cli import summarize_report

        print(f"\nValidation ({run_dir})")
        print("  " + summarize_report(json.loads((run_dir / "report.json").read_text()), str(run_dir)).replace("\n", "\n  "))

    name = conf["model_name"]
    uri = default_tracking_uri()
    champion, challenger = alias_version(name, CHAMPION, uri), alias_version(name, CHALLENGER, uri)
    store = home / "rollout" / name
    print("\nMLflow")
    print(f"  tracking URI : {uri}")
    print(f"  UI           : .venv/bin/mlflow ui --backend-store-uri {uri} --port 5000   (then http://127.0.0.1:5000)")
    print(f"  registry     : models:/{name}@{CHAMPION} -> version {champion}; @{CHALLENGER} -> version {challenger}")
    print("Rollout store")
    for channel in conf["channels"]:
        pointer = store / "channels" / f"{channel}.json"
        if pointer.exists():
            value = json.loads(pointer.read_text()).get("signed") or {}  # a signed envelope
            print(f"  {channel:<5}: version {value['version']} {value['artifact']}  ({pointer})")
    if champion:
        print(f"  manifest     : {store / 'versions' / champion / 'manifest.json'}")
    if (home / "keys" / "root.json").exists():  # the development release key of the embedded mode
        print(f"  device       : .venv/bin/onnxcast edge pull --store {home / 'rollout'} --model {name} "
              f"--channel edge --dest {home / 'device'} --trust {home / 'keys' / 'root.json'}")
    print("Airflow UI     : make airflow   (then http://127.0.0.1:8080, DAG onnxcast_training)")
    return 0 if str(run.state) in ("success", "DagRunState.SUCCESS") else 1


if __name__ == "__main__":
    sys.exit(main())
