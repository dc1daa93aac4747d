"""Moved to :mod:`onnxcast.rollout.edge`: this alias keeps old imports (and patches) working."""

import sys

from onnxcast.rollout import edge as _module

sys.modules[__name__] = _module
