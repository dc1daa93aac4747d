"""The Arm sysroot that runs the aarch64 target under qemu-user: Debian's arm64 python3.11 with the
aarch64 wheels of numpy and ONNX Runtime, built once under ``$ONNXCAST_HOME/targets/`` with pinned
versions (``scripts/arm_sysroot.py`` builds it; the aarch64 runner only reads it).

How, and why each piece (PITFALLS.md, "Arm emulation"): the Debian packages come from apt with a
private state folder and ``APT::Architecture=arm64`` (nothing of the host's dpkg or apt lists
changes: no ``dpkg --add-architecture``), unpacked with ``dpkg -x``; the wheels come from pip with
``--platform``; and ONNX Runtime's cpuinfo library crashes at import on the host's x86 files, so the
runner bind-mounts the Arm ``cpuinfo`` written here over /proc/cpuinfo in a private mount namespace.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from onnxcast.base import environment
from onnxcast.base.files import onnxcast_home
from onnxcast.targets.declarations import QEMU_CPU

# Debian 12 (bookworm) arm64 packages: python3.11 and the shared libraries numpy and ONNX Runtime
# load (libstdc++, libgcc), nothing more (no perl, no dpkg). Versions as of 2026-12-05; when the
# mirror drops one, the build fails naming it: update the pin here.
DEBIAN_PACKAGES = {
    "python3.11": "3.11.2-6+deb12u9",
    "python3.11-minimal": "3.11.2-6+deb12u9",
    "libpython3.11-minimal": "3.11.2-6+deb12u9",
    "libpython3.11-stdlib": "3.11.2-6+deb12u9",
    "libc6": "2.36-9+deb12u14",
    "libgcc-s1": "12.2.0-14+deb12u1",
    "libstdc++6": "12.2.0-14+deb12u1",
    "zlib1g": "1:1.2.13.dfsg-1+deb12u1",
    "libexpat1": "2.5.0-1+deb12u5",
    "libffi8": "3.4.4-1",
    "libssl3": "3.0.22-1~deb12u2",
    "libbz2-1.0": "1.0.8-5+b1",
    "liblzma5": "5.4.1-1+deb12u2",
    "libcrypt1": "1:4.4.33-2",
    "libuuid1": "2.38.1-5+deb12u3",
    "libsqlite3-0": "3.40.1-2+deb12u2",
    "libncursesw6": "6.4-4",
    "libtinfo6": "6.4-4",
    "libreadline8": "8.2-1.3",
    "libzstd1": "1.5.4+dfsg2-5+deb12u1",
    "libmd0": "1.0.4-2",
}
# the device's runtime, as onnxcast pins it (requirements/constraints.txt); installed --no-deps:
# inference needs numpy and onnxruntime's binary only (flatbuffers, protobuf, sympy serve its tools)
WHEELS = ("numpy==2.4.6", "onnxruntime==1.32.0")
# TVM's aarch64 runtime for the tvm-aarch64 target (built with --tvm), in a folder of its own
TVM_WHEELS = ("apache-tvm==0.27.0.post1", "apache-tvm-ffi==0.1.15.post2", "ml_dtypes==0.6.0",
              "typing_extensions==4.16.0")
WHEEL_PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_27_aarch64", "manylinux_2_28_aarch64")
PYTHON = "usr/bin/python3.11"
QEMU = "qemu-aarch64-static"
# /proc/cpuinfo of a four-core Cortex-A72 (what a Raspberry Pi 4 prints): ONNX Runtime's cpuinfo
# reads it at import and crashes on the host's x86 one
ARM_CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\n"
    "CPU revision\t: 3\n\n" for i in range(4)) + "Hardware\t: BCM2835\nModel\t\t: Raspberry Pi 4 Model B\n"
SYSROOT_NAME = "aarch64-py311"
RECORD = "sysroot.json"  # written last: its presence, with these pins, means the sysroot is complete


class SysrootError(RuntimeError):
    """The Arm sysroot cannot be built or used; the message says what is missing, on one line."""


@dataclass(frozen=True)
class ArmSysroot:
    """The folders of a built sysroot."""

    path: Path

    @property
    def root(self) -> Path:  # the unpacked Debian packages (qemu's -L)
        return self.path / "root"

    @property
    def site(self) -> Path:  # the aarch64 wheels (PYTHONPATH)
        return self.path / "site"

    @property
    def tvm_site(self) -> Path:  # TVM's aarch64 wheels (PYTHONPATH of the tvm-aarch64 target)
        return self.path / "site-tvm"

    @property
    def cpuinfo(self) -> Path:
        return self.path / "cpuinfo"

    @property
    def python(self) -> Path:
        return self.root / PYTHON

    def record(self) -> dict | None:
        try:
            return json.loads((self.path / RECORD).read_text())
        except (OSError, ValueError):
            return None

    def is_complete(self, tvm: bool = False) -> bool:
        """Built with these pins (and TVM's runtime, when ``tvm``)."""
        record = self.record()
        return record is not None and (record == expected_record(True) or (not tvm and record == expected_record()))


def expected_record(tvm: bool = False) -> dict:
    return {"debian": dict(DEBIAN_PACKAGES), "wheels": list(WHEELS), "qemu_cpu": QEMU_CPU,
            "tvm_wheels": list(TVM_WHEELS) if tvm else []}


def default_sysroot(home: str | Path | None = None) -> ArmSysroot:
    """``$ONNXCAST_HOME/targets/aarch64-py311`` (``ONNXCAST_ARM_SYSROOT`` overrides the folder)."""
    override = environment.get("ONNXCAST_ARM_SYSROOT")
    return ArmSysroot(Path(override) if override else onnxcast_home(home) / "targets" / SYSROOT_NAME)


def missing_tools() -> list[str]:
    """The host programs the sysroot build and the emulated run need and this host lacks."""
    return [tool for tool in (QEMU, "apt-get", "dpkg", "unshare", "mount") if shutil.which(tool) is None]


def build_sysroot(sysroot: ArmSysroot | None = None, *, tvm: bool = False, log=print) -> ArmSysroot:
    """Build the sysroot (with TVM's aarch64 runtime when ``tvm``) unless it is complete with these pins
    (then nothing to do). Built in a temporary folder next to it and renamed into place, so a failed
    build leaves nothing half made."""
    sysroot = sysroot or default_sysroot()
    if sysroot.is_complete(tvm=tvm):
        log(f"sysroot {sysroot.path} is complete: nothing to do")
        return sysroot
    missing = [t for t in missing_tools() if t != QEMU]
    if missing:
        raise SysrootError(f"cannot build the Arm sysroot: {', '.join(missing)} not found on this host")
    sysroot.path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{SYSROOT_NAME}-", dir=sysroot.path.parent))
    try:
        staged = ArmSysroot(work / "sysroot")
        staged.root.mkdir(parents=True)
        for deb in _download_debs(work / "apt", log):
            _run(["dpkg", "-x", str(deb), str(staged.root)])
        log(f"downloading aarch64 wheels {' '.join(WHEELS)}")
        _pip_target(staged.site, WHEELS)
        if tvm:
            log(f"downloading TVM's aarch64 wheels {' '.join(TVM_WHEELS)}")
            _pip_target(staged.tvm_site, TVM_WHEELS)
        staged.cpuinfo.write_text(ARM_CPUINFO)
        (staged.path / RECORD).write_text(json.dumps(expected_record(tvm), indent=1) + "\n")
        if sysroot.path.exists():
            shutil.rmtree(sysroot.path)
        staged.path.rename(sysroot.path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"sysroot {sysroot.path} built")
    return sysroot


def _download_debs(folder: Path, log) -> list[Path]:
    """The pinned arm64 .deb files, through apt with a private state folder (the host's apt lists
    and dpkg database are neither read for arm64 nor changed)."""
    lists, cache, debs = folder / "lists", folder / "cache", folder / "debs"
    for d in (lists / "partial", cache / "archives" / "partial", debs):
        d.mkdir(parents=True, exist_ok=True)
    options = ["-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={cache}", "-o", "APT::Architecture=arm64",
               "-o", "APT::Architectures::=arm64", "-o", "Debug::NoLocking=1"]
    log("apt-get update (arm64 lists, private state folder)")
    _run(["apt-get", *options, "update", "-qq"])
    wanted = [f"{name}:arm64={version}" for name, version in DEBIAN_PACKAGES.items()]
    log(f"apt-get download {len(wanted)} arm64 packages")
    _run(["apt-get", *options, "download", "-qq", *wanted], cwd=debs)
    return sorted(debs.glob("*.deb"))


def _pip_target(folder: Path, wheels: tuple[str, ...]) -> None:
    """aarch64 wheels for CPython 3.11 into ``folder``, without their dependencies (each is pinned)."""
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:",
          "--python-version", "3.11", "--implementation", "cp", "--target", str(folder),
          *[arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)], *wheels])


def _run(command: list[str], cwd: Path | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        detail = " ".join((done.stderr or done.stdout).split())[-300:]
        raise SysrootError(f"{Path(command[0]).name} {command[1] if len(command) > 1 else ''} failed "
                           f"(exit {done.returncode}): {detail}")
