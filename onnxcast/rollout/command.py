"""The command a user runs for the device side, so hints name that one.

``onnxcast edge pull`` in the full install, ``onnxcast-edge pull`` in the device install
(``onnxcast-edge`` sets it on start): a hint naming ``onnxcast edge trust`` on a device
that has no ``onnxcast`` command sent users looking for a command they lack (issue 18,
item 15).
"""

from __future__ import annotations

FULL_PROGRAM = "onnxcast edge"
DEVICE_PROGRAM = "onnxcast-edge"
_program = [FULL_PROGRAM]


def use_program(name: str) -> None:
    """Name the device commands after ``name`` (the entry point that started)."""
    _program[0] = name


def program() -> str:
    """The name the device commands go by now (see :func:`use_program`)."""
    return _program[0]


def device_command(words: str) -> str:
    """``words`` (``"trust --dest DEST --root root.json"``) as the user types it."""
    return f"{_program[0]} {words}"


def keys_command(words: str) -> str:
    """A ``keys`` subcommand (``"root --out FILE"``) as the user types it: ``onnxcast keys``
    in the full install, ``onnxcast-edge keys`` on a device (both have it)."""
    program = "onnxcast" if _program[0] == FULL_PROGRAM else _program[0]
    return f"{program} keys {words}"
