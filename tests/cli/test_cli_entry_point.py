"""The `onnxcast` console script itself: version, help on every option, every subcommand routed.

The first release registered its rollout commands with a key `cli.main` never read, and every
test built its own parser, so all four commands crashed for users while the tests passed.
These tests start the installed console script, or call `cli.main`, and nothing else.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onnxcast import __version__, cli

SCRIPT = Path(sys.executable).with_name("onnxcast")


def run_script(*args: str) -> subprocess.CompletedProcess:
    executable = str(SCRIPT) if SCRIPT.exists() else shutil.which("onnxcast")
    assert executable, "the onnxcast console script is not installed next to the interpreter or on PATH"
    return subprocess.run([executable, *args], capture_output=True, text=True, timeout=120)


def test_version_through_the_console_script():
    result = run_script("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"onnxcast {__version__}"


@pytest.mark.parametrize("module", ["onnxcast", "onnxcast.cli"])
def test_version_through_python_m(module):
    """``python -m onnxcast`` and ``python -m onnxcast.cli`` run the whole command (the second
    once stopped at a NameError: its ``__main__`` block ran before the release commands existed)."""
    result = subprocess.run([sys.executable, "-m", module, "promote", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--report" in result.stdout


def _commands(parser: argparse.ArgumentParser, path=()):
    """Every leaf subcommand of the real parser, with its parser."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path, parser
        return
    for name, sub in subparsers[0].choices.items():
        yield from _commands(sub, (*path, name))


LEAVES = list(_commands(cli.build_parser()))


def test_the_commands_users_are_told_about_exist():
    names = {" ".join(path) for path, _ in LEAVES}
    assert {"pipeline", "promote", "rollback", "edge pull", "edge predict"} <= names


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=" ".join)
def test_every_option_has_a_help_text_and_every_command_a_handler(path):
    parser = dict(LEAVES)[path]
    bare = [a.option_strings[0] for a in parser._actions
            if a.option_strings and a.help in (None, "") and not isinstance(a, argparse._HelpAction)]
    assert not bare, f"onnxcast {' '.join(path)}: options without help: {bare}"
    handler = parser.get_default("handler")
    assert callable(handler), f"onnxcast {' '.join(path)} sets no handler for cli.main to call"


@pytest.mark.parametrize("path", [p for p, _ in LEAVES], ids=" ".join)
def test_help_through_the_console_script(path):
    result = run_script(*path, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: onnxcast" in result.stdout


def test_a_missing_required_option_is_a_usage_error_not_a_traceback():
    result = run_script("promote", "--store", "x", "--model", "m")
    assert result.returncode == 2
    assert "the following arguments are required: --report, --channel" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("argv", [["--version"], ["pipeline", "--help"]])
def test_output_cut_short_by_the_reader_is_not_a_traceback(monkeypatch, argv):
    """`onnxcast ... | head`: the reader closed the pipe before the output was written."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone: every write now fails with EPIPE
    stream = open(write_end, "w")  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        assert cli.main(argv) == 0
    finally:
        monkeypatch.undo()
        stream.close()


def _every_command(parser: argparse.ArgumentParser, path=()):
    """The root, every group and every leaf command of the real parser."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _every_command(sub, (*path, name))


@pytest.mark.parametrize("path", list(_every_command(cli.build_parser())), ids=lambda p: " ".join(p) or "onnxcast")
def test_help_shows_no_restructuredtext_markup(path, capsys):
    """`onnxcast --help` printed "The ``onnxcast`` command line." (a docstring's reST)."""
    import re

    with pytest.raises(SystemExit) as done:
        cli.main([*path, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "usage: onnxcast" in text
    markup = re.findall(r"``[^`]*``|:[a-z]+:`[^`]*`|`[^`]+`_", text)
    assert not markup, markup
