"""Build (once) the Arm sysroot of the aarch64 target: Debian's arm64 python3.11 and the aarch64 wheels
of numpy and ONNX Runtime, pinned (onnxcast.targets.sysroot), under $ONNXCAST_HOME/targets/.

    python scripts/arm_sysroot.py [--tvm] [--path DIR]

Idempotent: a complete sysroot with the same pins is left as it is. Needs apt-get, dpkg and network
access to Debian's mirror and PyPI; running it needs qemu-user-static too (make arm-tools).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from onnxcast.targets.sysroot import (
    ArmSysroot,
    SysrootError,
    build_sysroot,
    default_sysroot,
    missing_tools,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tvm", action="store_true", help="with TVM's aarch64 runtime (the tvm-aarch64 target)")
    parser.add_argument("--path", type=Path, help="sysroot folder (default: $ONNXCAST_HOME/targets/aarch64-py311)")
    args = parser.parse_args(argv)
    sysroot = ArmSysroot(args.path) if args.path else default_sysroot()
    try:
        build_sysroot(sysroot, tvm=args.tvm)
    except SysrootError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if missing_tools():
        print(f"note: {', '.join(missing_tools())} not found: the sysroot is built, emulation needs them "
              "(make arm-tools)", file=sys.stderr)
    print(sysroot.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
