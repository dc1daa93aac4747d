"""Moved to :mod:`onnxcast.rollout.store`: this alias keeps old imports (and patches) working."""

import sys

from onnxcast.rollout import store as _module

sys.modules[__name__] = _module
