"""``python -m onnxcast``: the full command, or the device command on a device install.

The device distribution (onnxcast-edge) ships only onnxcast.base and the device's rollout
modules, so ``onnxcast.cli`` is not there: the device commands run instead, as
``onnxcast-edge`` would.
"""

import sys
from importlib import metadata


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


if _installed("onnxcast-edge") and not _installed("onnxcast"):
    from onnxcast.rollout.cli import edge_main as main
else:
    from onnxcast.cli import main

sys.exit(main())
