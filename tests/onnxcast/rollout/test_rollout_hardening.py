"""Hostile surroundings of the rollout: a device folder with planted symlinks, a store holding what
no writer makes (deep JSON, a FIFO, a giant pointer), writers signing with a revoked key,
inputs that are not tables, and the device command itself. Each through the real CLI
(``onnxcast.cli.main`` or the console scripts): one error line, nothing outside the device
folder touched, the old state still served."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from rollout_support import one_error_line, raw_get, raw_put

from onnxcast import cli
from onnxcast.rollout.edge import pull
from onnxcast.rollout.promote import promote
from onnxcast.rollout.signing import generate_key
from onnxcast.rollout.store import open_store

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
EDGE = "m/channels/edge.json"
# 100,000 nested arrays in 200 KB: json.loads raised RecursionError on it.
DEEP_POINTER = b'{"signed": ' + b"[" * 100_000


def edge_pull(store: str, dest, *extra: str) -> int:
    return cli.main(["edge", "pull", "--store", store, "--model", "m", "--channel", "edge", "--dest", str(dest),
                     *extra])








def console(*argv: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """The ``onnxcast`` console script in a child process, with this worktree first on the path.
    A timeout turns a hang into a failure instead of a stuck test run, and a 4 GiB address
    space cap turns reading ``/dev/zero`` into a MemoryError instead of a swapped-out machine."""
    import resource

    def cap_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    environment = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([str(BIN / "onnxcast"), *argv], capture_output=True, text=True, timeout=timeout,
                          env=environment, preexec_fn=cap_memory)


@pytest.fixture
def outside(tmp_path) -> Path:
    """A folder outside every device folder, holding something that must survive."""
    folder = tmp_path / "outside"
    (folder / "important_dir").mkdir(parents=True)
    (folder / "important_dir" / "data.txt").write_text("keep me")
    return folder


def assert_untouched(outside: Path) -> None:
    assert sorted(p.relative_to(outside).as_posix() for p in outside.rglob("*")) == \
        ["important_dir", "important_dir/data.txt"]
    assert (outside / "important_dir" / "data.txt").read_text() == "keep me"


# --- item 3: the device folder never follows a symlink ------------------------------------

class TestDeviceFolderSymlinks:
    def test_symlinked_versions_is_refused_and_the_folder_outside_survives(self, tmp_path, make_run, outside,
                                                                           capsys):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        dest.mkdir()
        (dest / "versions").symlink_to(outside)
        assert edge_pull(store, dest) == 2
        one_error_line(capsys, "versions is a symbolic link or not a folder; a device folder never follows symlinks")
        assert_untouched(outside)
        assert not os.path.lexists(dest / "current")
        assert [p.name for p in dest.iterdir() if p.name.startswith(".staging")] == []

    def test_versions_swapped_for_a_symlink_after_an_install(self, tmp_path, make_run, outside, capsys):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        assert edge_pull(store, dest) == 0
        (dest / "versions").rename(tmp_path / "moved-versions")
        (dest / "versions").symlink_to(outside)
        promote(make_run("b"), store, "m", "edge", version="2")
        capsys.readouterr()
        assert edge_pull(store, dest) == 2
        one_error_line(capsys, "versions is a symbolic link or not a folder")
        assert_untouched(outside)

    def test_symlinked_entry_inside_versions_is_unlinked_not_followed(self, tmp_path, make_run, outside):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", dest)
        (dest / "versions" / "old").symlink_to(outside)
        promote(make_run("b"), store, "m", "edge", version="2")
        pull(store, "m", "edge", dest)
        assert sorted(p.name for p in (dest / "versions").iterdir()) == ["1", "2"]  # the link is gone, not followed
        assert_untouched(outside)

    def test_dest_reached_through_a_symlink_works(self, tmp_path, make_run, capsys):
        store, real, dest = str(tmp_path / "store"), tmp_path / "real-device", tmp_path / "device"
        real.mkdir()
        dest.symlink_to(real)
        for version, tag in (("1", "a"), ("2", "b"), ("3", "c")):
            promote(make_run(tag), store, "m", "edge", version=version)
            assert edge_pull(store, dest) == 0
            assert f"installed version {version}" in capsys.readouterr().out
            assert sorted(p.name for p in (real / "versions").iterdir()) == sorted({str(int(version) - 1), version}
                                                                                   - {"0"})
        assert (real / "current").readlink().as_posix() == "versions/3"
        assert (real / "previous").readlink().as_posix() == "versions/2"
        assert edge_pull(store, dest) == 0
        assert "already at version 3" in capsys.readouterr().out

    def test_symlinked_pull_lock_is_refused_and_nothing_is_created_at_its_target(self, tmp_path, make_run,
                                                                                  outside, capsys):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        dest.mkdir()
        (dest / ".pull.lock").symlink_to(outside / "created-by-pull")
        assert edge_pull(store, dest) == 2
        one_error_line(capsys, ".pull.lock is a symbolic link")
        assert_untouched(outside)

    def test_symlinked_trust_folder_is_refused(self, tmp_path, make_run, outside, capsys):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        dest.mkdir()
        (dest / "trust").symlink_to(outside)
        assert edge_pull(store, dest) == 2
        one_error_line(capsys, "trust is a symbolic link or not a folder")
        assert_untouched(outside)
        assert cli.main(["edge", "trust", "--dest", str(dest), "--root", os.environ["ONNXCAST_TRUST"]]) == 2
        one_error_line(capsys, "trust is a symbolic link or not a folder")
        assert_untouched(outside)


# --- item 5: what a store writer plants cannot stop a follower or a writer -----------------

class TestHostileStore:
    def test_deep_json_pointer_is_one_refusal_per_poll(self, store_uri, make_run, tmp_path, capsys):
        dest = tmp_path / "device"
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        assert edge_pull(store_uri, dest) == 0
        capsys.readouterr()
        raw_put(store_uri, EDGE, DEEP_POINTER)
        assert edge_pull(store_uri, dest) == 1
        one_error_line(capsys, "channels/edge.json is nested deeper than 64 levels; refusing it")
        assert edge_pull(store_uri, dest, "--watch", "--interval", "0", "--max-polls", "3") == 1
        captured = capsys.readouterr()
        lines = captured.out.splitlines()
        assert len(lines) == 3 and captured.err == "", captured
        for number, line in enumerate(lines, start=1):
            assert line.startswith(f"poll {number}: refused, keeping the current model: ") and \
                "nested deeper than 64 levels" in line, line
        assert (dest / "current").readlink().as_posix() == "versions/1"

    @pytest.mark.parametrize("command", [
        ["refresh", "--channel", "edge"],
        ["rollback", "--channel", "edge", "--to", "1", "--reason", "test"],
        ["promote", "--channel", "edge", "--version", "2"],
    ])
    def test_deep_json_pointer_stops_writers_on_one_line(self, store_uri, make_run, command, capsys):
        promote(make_run("a"), store_uri, "m", "edge", version="1")
        raw_put(store_uri, EDGE, DEEP_POINTER)
        if command[0] == "promote":
            command = [*command, "--report", str(make_run("b"))]
        assert cli.main([*command, "--store", store_uri, "--model", "m"]) == 1
        one_error_line(capsys, "channels/edge.json is nested deeper than 64 levels; refusing it")
        assert raw_get(store_uri, EDGE) == DEEP_POINTER
        assert open_store(store_uri).read_manifest("m", "2") is None  # promote wrote nothing

    def test_fifo_pointer_in_a_local_store_does_not_hang(self, tmp_path, make_run):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        pointer = tmp_path / "store" / EDGE
        pointer.unlink()
        os.mkfifo(pointer)
        for argv in (["edge", "pull", "--dest", str(dest)], ["refresh"]):
            done = console(*argv, "--store", store, "--model", "m", "--channel", "edge", timeout=60)
            assert done.returncode == 1, done.stderr
            assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
            assert "channels/edge.json: not a regular file (a FIFO); refusing it" in done.stderr

    def test_giant_pointer_is_refused_without_reading_it_whole(self, tmp_path, make_run, capsys):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        pointer = tmp_path / "store" / EDGE
        with open(pointer, "wb") as f:  # 200 MB, sparse: costs no disk
            f.write(b'{"signed": ')
            f.truncate(200 * 1024 * 1024)
        for argv, code in ((["edge", "pull", "--dest", str(dest)], 1), (["refresh"], 1),
                           (["rollback", "--to", "1", "--reason", "x"], 1)):
            tracemalloc.start()
            try:
                assert cli.main([*argv, "--store", store, "--model", "m", "--channel", "edge"]) == code
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            one_error_line(capsys, "channels/edge.json: longer than 1,048,576 bytes")
            assert peak < 32 * 1024 * 1024, f"{argv[0]} allocated {peak:,} bytes for a refused pointer"


    def test_the_servers_follower_counts_each_refusal_and_keeps_serving(self, tmp_path, make_run):
        """The server's channel follower calls the same pull: a deep pointer is a RefusedError
        and a FIFO a StoreError (counted by type in poll_errors_total), never a crash or a hang."""
        import threading

        from onnxcast.serving.model import ChannelFollower

        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        errors: list[str] = []
        follower = ChannelFollower(store, "m", "edge", dest, on_poll_error=errors.append)
        assert follower.poll() and follower.current.version == "1"
        pointer = tmp_path / "store" / EDGE
        pointer.write_bytes(DEEP_POINTER)
        assert not follower.poll()
        pointer.unlink()
        os.mkfifo(pointer)
        polled = threading.Thread(target=follower.poll, daemon=True)
        polled.start()
        polled.join(30)
        assert not polled.is_alive(), "a FIFO pointer blocked the follower"
        assert errors == ["RefusedError", "StoreError"] and follower.current.version == "1"

    def test_a_signing_key_that_is_not_a_file_does_not_hang_a_writer(self, tmp_path, make_run):
        store = str(tmp_path / "store")
        promote(make_run("a"), store, "m", "edge", version="1")
        done = console("refresh", "--store", store, "--model", "m", "--channel", "edge", "--signing-key", "/dev/zero",
                       timeout=60)
        assert done.returncode == 2
        assert done.stderr == "error: signing key '/dev/zero' is not a regular file (a character device); " \
                              "cannot read the signing key\n"


# --- item 10: a writer verifies what it signs against the published root -------------------

class TestWriterChecksThePublishedRoot:
    @pytest.fixture
    def rotated(self, tmp_path, make_run, capsys):
        """Version 1 signed by the old key, then root 2 (the new key only) published."""
        store = str(tmp_path / "store")
        old, new = generate_key(tmp_path / "keys/old"), generate_key(tmp_path / "keys/new")
        promote(make_run("a"), store, "m", "edge", version="1", signers=[old["private"]])
        promote(make_run("b"), store, "m", "edge", version="2", signers=[old["private"]])
        root2 = tmp_path / "root2.json"
        assert cli.main(["keys", "root", "--out", str(root2), "--previous", str(old["root"]),
                         "--root-key", str(new["public"]), "--release-key", str(new["public"]),
                         "--sign-with", str(old["private"]), "--sign-with", str(new["private"])]) == 0
        assert cli.main(["keys", "publish-root", "--store", store, "--root", str(old["root"])]) == 0
        assert cli.main(["keys", "publish-root", "--store", store, "--root", str(root2)]) == 0
        capsys.readouterr()
        return store, old, new

    @pytest.mark.parametrize("command", [
        ["refresh", "--channel", "edge"],
        ["rollback", "--channel", "edge", "--reason", "bad model"],
        ["promote", "--channel", "edge", "--version", "3"],
    ])
    def test_revoked_key_is_refused_and_the_channel_unchanged(self, rotated, make_run, command, capsys):
        store, old, _ = rotated
        before = raw_get(store, EDGE)
        if command[0] == "promote":
            command = [*command, "--report", str(make_run("c"))]
        assert cli.main([*command, "--store", store, "--model", "m", "--signing-key", str(old["private"])]) == 2
        one_error_line(capsys, "root/2.root.json: the signing key(s) (")
        assert raw_get(store, EDGE) == before
        assert not (Path(store) / "m/versions/3").exists()

    def test_the_current_key_promotes_and_refreshes_and_devices_follow(self, rotated, make_run, tmp_path, capsys,
                                                                        monkeypatch):
        store, old, new = rotated
        signing = ["--store", store, "--model", "m", "--channel", "edge", "--signing-key", str(new["private"])]
        assert cli.main(["promote", "--report", str(make_run("c")), "--version", "3", *signing]) == 0
        assert cli.main(["refresh", *signing]) == 0
        assert "version 3 re-signed" in capsys.readouterr().out
        monkeypatch.delenv("ONNXCAST_TRUST")
        assert edge_pull(store, tmp_path / "device", "--trust", str(old["root"])) == 0  # walks to root 2
        assert "installed version 3" in capsys.readouterr().out

    @pytest.mark.parametrize("command", [["refresh"], ["rollback", "--to", "1", "--reason", "bad model"]])
    def test_a_pointer_to_a_version_signed_by_a_dropped_key_is_refused(self, rotated, command, capsys):
        """Version 2 and 1 were signed by the old key only: a new pointer to them, however
        well signed, is refused by every device, so the writer refuses to write it."""
        store, _, new = rotated
        before = raw_get(store, EDGE)
        assert cli.main([*command, "--store", store, "--model", "m", "--channel", "edge",
                         "--signing-key", str(new["private"])]) == 2
        one_error_line(capsys, "manifest.json: signed by 0 of the 1 release key(s) required of trust root version 2 "
                               "(published in the store); devices would refuse it, nothing written; promote that "
                               "model again as a new version")
        assert raw_get(store, EDGE) == before

    def test_a_writer_checks_the_manifest_role_too(self, tmp_path, make_run, capsys):
        """A root whose release key signs manifests while another key signs pointers: signing
        with the pointer key alone is refused before any object is written."""
        from onnxcast.rollout.signing import load_signer, make_root, sign_root

        store = tmp_path / "store"
        manifests, pointers = generate_key(tmp_path / "keys/m"), generate_key(tmp_path / "keys/p")
        m, p = load_signer(str(manifests["private"])), load_signer(str(pointers["private"]))
        root = make_root([m.public_key], [m.public_key], pointer_keys=[p.public_key])
        (store / "root").mkdir(parents=True)
        (store / "root/1.root.json").write_bytes(sign_root(root, [m]))
        assert cli.main(["promote", "--report", str(make_run("a")), "--store", str(store), "--model", "m",
                         "--channel", "edge", "--version", "1", "--signing-key", str(pointers["private"])]) == 2
        one_error_line(capsys, "manifest.json: signed by 0 of the 1 release key(s) required of trust root version 1")
        assert not (store / "m").exists()


# --- items 4, 6, 16: edge predict reads tables only, quotes nothing, prints times -----------

class TestPredictInput:
    @pytest.fixture
    def device(self, tmp_path, make_run):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        pull(store, "m", "edge", dest)
        return dest

    def test_dev_zero_is_refused_at_once(self, device):
        # A child process with a memory cap and a timeout: the old code read /dev/zero until
        # memory ran out (3.6 GB in 8 s).
        done = console("edge", "predict", "--dir", str(device), "--input", "/dev/zero", timeout=60)
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr == "error: input '/dev/zero' is not a regular file (a character device)\n"

    def test_fifo_input_is_refused_at_once(self, device, tmp_path):
        os.mkfifo(tmp_path / "in.csv")
        done = console("edge", "predict", "--dir", str(device), "--input", str(tmp_path / "in.csv"), timeout=60)
        assert done.returncode == 2 and "is not a regular file (a FIFO)" in done.stderr, done.stderr

    def test_a_file_that_is_not_a_table_is_not_quoted(self, device, tmp_path, capsys):
        secret = "root:$y$j9T$Hq3xSECRETHASHpart$Zk1:19000:0:99999:7:::"
        shadow = tmp_path / "shadow"
        shadow.write_text(f"{secret}\ndaemon:*:19000:0:99999:7:::\n")
        assert cli.main(["edge", "predict", "--dir", str(device), "--input", str(shadow)]) == 2
        err = one_error_line(capsys, "missing column(s) 'y', 'x1'; its first line is not a header of column names "
                                     "(1 field(s); not shown)")
        assert "SECRET" not in err and "19000" not in err and "$y$" not in err

    def test_long_names_and_values_are_capped(self, device, tmp_path, capsys):
        wide = tmp_path / "wide.csv"
        wide.write_text("ds," + ",".join(f"column_{i}" for i in range(500)) + "\n1,2\n")
        assert cli.main(["edge", "predict", "--dir", str(device), "--input", str(wide)]) == 2
        err = one_error_line(capsys, "found 'ds', 'column_0'")
        assert "and 481 more" in err and len(err) < 600
        long_value = tmp_path / "value.csv"
        long_value.write_text("y,x1\n" + "1,2\n" * 15 + "1," + "A" * 10_000 + "\n")
        assert cli.main(["edge", "predict", "--dir", str(device), "--input", str(long_value)]) == 2
        err = one_error_line(capsys, "column 'x1' has non-numeric value 'AAAA")
        assert len(err) < 400

    def test_prints_times_and_the_version(self, device, tmp_path, capsys):
        table = tmp_path / "in.csv"
        table.write_text("ds,y,x1\n" + "".join(f"2026-03-01 {h:02d}:00:00,{100 + h},5\n" for h in range(20)))
        assert cli.main(["edge", "predict", "--dir", str(device), "--input", str(table)]) == 0
        rows = [line.split(",") for line in capsys.readouterr().out.splitlines()]
        assert rows[0] == ["step", "ds", "forecast", "version"]
        assert [r[1] for r in rows[1:]] == [f"2026-03-01 {h}:00:00" for h in (20, 21, 22, 23)]
        assert {r[3] for r in rows[1:]} == {"1"} and all(float(r[2]) == float(r[2]) for r in rows[1:])

    @pytest.mark.parametrize("last, freq, expected", [
        ("2026-01-31", "MS", ["2026-02-01", "2026-03-01"]),
        ("2026-01-31", "ME", ["2026-02-28", "2026-03-31"]),
        ("2026-01-04", "W-SUN", ["2026-01-11", "2026-01-18"]),
        ("2026-01-02", "B", ["2026-01-05", "2026-01-06"]),
        ("2026-01-01T23:30:00Z", "30min", ["2026-01-02T00:00:00Z", "2026-01-02T00:30:00Z"]),
        ("2026-01-01T00:00:00+01:00", "2h", ["2026-01-01T02:00:00+01:00", "2026-01-01T04:00:00+01:00"]),
        ("2025-01-01", "YS", ["2026-01-01", "2027-01-01"]),
        ("39", "h", None),
        ("2026-01-01", "fortnightly", None),
    ])
    def test_future_times(self, last, freq, expected):
        from onnxcast.rollout.edge import future_times

        assert future_times(last, freq, 2) == expected


# --- item 15: the device command, installed for real ----------------------------------------

DEVICE_REQUIREMENTS = ["numpy", "onnxruntime", "boto3", "tuf", "securesystemslib[crypto]", "cryptography"]


def _closure(requirements: list[str]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``requirements`` need, transitively (extras followed)."""
    from packaging.markers import Marker
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(r) for r in requirements]
    while todo:
        requirement = todo.pop()
        key = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if key in found:
            continue
        try:
            found[key] = dist = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            child = Requirement(line)
            extras = requirement.extras or {""}
            if child.marker is None or any(Marker(str(child.marker)).evaluate({"extra": e}) for e in extras):
                todo.append(child)
    return found


@pytest.fixture(scope="module")
def device_venv(tmp_path_factory) -> Path:
    """A fresh venv with only ``pip install --no-deps`` of the built distributions/edge, and
    the device's dependencies (and nothing else: no torch, pandas, onnx) linked from this
    environment through a .pth file, so nothing is downloaded."""
    root = tmp_path_factory.mktemp("device-install")
    source = root / "source"
    source.mkdir()
    # Built from a copy, so no build/ or egg-info is left in the repository.
    (source / "pyproject.toml").write_bytes((REPO / "distributions/edge/pyproject.toml").read_bytes())
    (source / "onnxcast").symlink_to(REPO / "distributions/edge/onnxcast")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                    "-w", str(root / "wheel")], check=True, capture_output=True, timeout=300)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    wheel = next((root / "wheel").glob("onnxcast_edge-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q", "--no-deps",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    deps = root / "device-deps"
    deps.mkdir()
    for dist in _closure(DEVICE_REQUIREMENTS).values():
        base = Path(dist.locate_file(""))
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (deps / top).exists() and (base / top).exists():
                (deps / top).symlink_to(base / top)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "device-deps.pth").write_text(f"{deps}\n")
    return venv


def _device_contract_modules() -> set[str]:
    """The modules the import contract "The device package" (pyproject.toml) checks."""
    import tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    contract = next(c for c in contracts if c["name"].startswith("The device package"))
    found = set()
    for name in contract["source_modules"]:
        path = REPO / name.replace(".", "/")
        found |= ({f"{name}.{p.stem}" for p in path.glob("*.py")} if path.is_dir() else {name})
    return found


class TestDeviceInstall:
    def test_the_wheel_holds_only_the_device_modules(self, device_venv):
        """What a device installs is what the device contract keeps light (and nothing more:
        not the writer's promote, the pipeline, serving or Airflow)."""
        site = next(device_venv.glob("lib/python*/site-packages"))
        installed = {".".join(p.relative_to(site).with_suffix("").parts)
                     for p in (site / "onnxcast").rglob("*.py")}
        installed = {m.removesuffix(".__init__") for m in installed}
        expected = _device_contract_modules() | {"onnxcast", "onnxcast.__main__", "onnxcast.rollout"}
        expected = {m.removesuffix(".__init__") for m in expected}
        assert installed == expected

    def run(self, venv: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
        environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        return subprocess.run([*argv], capture_output=True, text=True, timeout=120, cwd=venv,
                              env={**environment, **(env or {})})

    def test_it_has_no_training_dependencies(self, device_venv):
        done = self.run(device_venv, str(device_venv / "bin/python"), "-c",
                        "import importlib.util as u, onnxcast; print(onnxcast.__file__); "
                        "print([m for m in ('torch', 'pandas', 'onnx', 'airflow', 'mlflow') if u.find_spec(m)])")
        assert done.returncode == 0, done.stderr
        assert str(device_venv) in done.stdout.splitlines()[0] and done.stdout.splitlines()[1] == "[]"

    def test_commands_version_and_python_m(self, device_venv, tmp_path, make_run):
        store, dest = str(tmp_path / "store"), tmp_path / "device"
        promote(make_run("a"), store, "m", "edge", version="1")
        edge, python = str(device_venv / "bin/onnxcast-edge"), str(device_venv / "bin/python")
        version = importlib.metadata.version("onnxcast")
        for argv in ([edge, "--version"], [python, "-m", "onnxcast", "--version"]):
            done = self.run(device_venv, *argv)
            assert (done.returncode, done.stdout) == (0, f"onnxcast-edge {version}\n"), done.stderr

        # No trust root yet: the hint names the command this device has.
        no_trust = {"ONNXCAST_TRUST": ""}
        done = self.run(device_venv, edge, "pull", "--store", store, "--model", "m", "--channel", "edge",
                        "--dest", str(dest), env=no_trust)
        assert done.returncode == 2 and "run 'onnxcast-edge trust --dest DEST --root root.json' once" in done.stderr
        assert "onnxcast edge" not in done.stderr
        done = self.run(device_venv, edge, "trust", "--dest", str(dest), "--root", os.environ["ONNXCAST_TRUST"])
        assert done.returncode == 0, done.stderr
        done = self.run(device_venv, edge, "pull", "--store", store, "--model", "m", "--channel", "edge",
                        "--dest", str(dest), env=no_trust)
        assert done.returncode == 0 and "installed version 1" in done.stdout, done.stderr
        # The first release's spelling still works, and so does python -m onnxcast.
        done = self.run(device_venv, edge, "edge", "pull", "--store", store, "--model", "m", "--channel", "edge",
                        "--dest", str(dest), env=no_trust)
        assert done.returncode == 0 and "already at version 1" in done.stdout, done.stderr
        table = tmp_path / "in.csv"
        table.write_text("ds,y,x1\n" + "".join(f"2026-01-01T{h:02d}:00:00Z,{100 + h},5\n" for h in range(20)))
        for argv in ([edge, "predict"], [python, "-m", "onnxcast", "predict"]):
            done = self.run(device_venv, *argv, "--dir", str(dest), "--input", str(table))
            assert done.returncode == 0, done.stderr
            lines = done.stdout.splitlines()
            assert lines[0] == "step,ds,forecast,version" and lines[1].startswith("1,2026-01-01T20:00:00Z,")
            assert lines[1].endswith(",1") and len(lines) == 5

    def test_full_install_python_m_is_the_full_command(self):
        done = console("--version")
        assert done.returncode == 0
        environment = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-m", "onnxcast", "edge", "predict", "--help"], capture_output=True,
                              text=True, timeout=120, env=environment)
        assert done.returncode == 0 and done.stdout.startswith("usage: onnxcast edge predict"), done.stderr
