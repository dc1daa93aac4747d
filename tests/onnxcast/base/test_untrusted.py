"""Reading untrusted input: regular files only, bounded size, bounded JSON depth."""

from __future__ import annotations

import os
import threading

import pytest

from onnxcast.base.untrusted import (
    UntrustedInputError,
    json_depth,
    loads_json,
    quote,
    read_json_file,
    read_regular_file,
    regular_file_size,
    series_id_problem,
)


def test_a_regular_file_is_read(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"a": [1, 2]}')
    assert read_json_file(path, what="pointer") == {"a": [1, 2]}


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_a_device_is_refused_by_name(device):
    with pytest.raises(UntrustedInputError, match=f"{device}.*character device"):
        read_regular_file(device, what="data")
    with pytest.raises(UntrustedInputError, match="character device"):
        regular_file_size(device, what="data", limit=10)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    thread = threading.Thread(target=lambda: done.append(pytest.raises(UntrustedInputError, read_regular_file, fifo, what="x")))
    thread.start()
    thread.join(5)
    assert done, "reading a FIFO blocked"
    with pytest.raises(UntrustedInputError, match="FIFO"):
        regular_file_size(fifo, what="x", limit=10)


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(UntrustedInputError, match="directory"):
        read_regular_file(tmp_path, what="x")


def test_a_file_over_the_limit_is_refused(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    with pytest.raises(UntrustedInputError, match="101 bytes, over the limit of 100"):
        read_regular_file(path, what="x", limit=100)
    assert read_regular_file(path, what="x", limit=101) == b"x" * 101


def test_a_symlink_is_refused_when_asked(tmp_path):
    target = tmp_path / "t"
    target.write_text("{}")
    (tmp_path / "link").symlink_to(target)
    assert read_json_file(tmp_path / "link", what="x") == {}
    with pytest.raises(UntrustedInputError, match="symbolic link"):
        read_regular_file(tmp_path / "link", what="x", follow_symlinks=False)
    with pytest.raises(UntrustedInputError, match="symbolic link"):
        regular_file_size(tmp_path / "link", what="x", limit=10, follow_symlinks=False)


def test_deep_json_is_refused_in_one_line_without_recursion():
    deep = b'{"signed":' + b"[" * 100_000
    with pytest.raises(UntrustedInputError, match="nested deeper than 64 levels") as caught:
        loads_json(deep, what="channel pointer")
    assert "\n" not in str(caught.value) and "[[[" not in str(caught.value)
    assert loads_json(b"[" * 64 + b"]" * 64, what="x") is not None


def test_brackets_inside_strings_do_not_count():
    assert json_depth(b'{"a": "[[[[\\"[[[["}') == 1


def test_invalid_json_is_named_without_quoting_it():
    with pytest.raises(UntrustedInputError, match="not valid JSON at byte 0") as caught:
        loads_json(b"root:*:20228:0:99999:7:::", what="manifest")
    assert "root" not in str(caught.value)
    with pytest.raises(UntrustedInputError, match="not valid JSON"):
        loads_json(b"\xff\xfe", what="manifest")


@pytest.mark.parametrize(("value", "problem"), [
    ("N1402", None), ("meter 7/2", None), ("007", None), ("Zürich-Höngg", None), ("x" * 100, None),
    ("", "empty"),
    ("x" * 101, "101 characters long, more than 100"),
    ("A" * (1 << 20), "1,048,576 characters long, more than 100"),
    ("s\n001", "not printable"), ("s\r001", "not printable"), ("s\x07bell", "not printable"),
    ("s\u202eevil", "not printable"), ("zero\u200bwidth", "not printable"), ("tab\there", "not printable"),
    (" s001", "leading or trailing spaces"), ("s001 ", "leading or trailing spaces"),
])
def test_one_series_id_rule_for_the_pipeline_and_the_device(value, problem):
    found = series_id_problem(value)
    assert (found is None) if problem is None else (problem in found), found


def test_quote_caps_long_values():
    assert quote("a" * 10) == repr("a" * 10)
    assert len(quote("a" * 1000)) == 60


@pytest.mark.parametrize(("document", "message"), [
    (b'{"version": ' + b"9" * 5000 + b"}", "integer of 5000 digits"),
    (b'{"counter": ' + b"9" * 4300 + b"}", "integer of 4300 digits"),
    (b'{"version": "\\ud800"}', "lone surrogate"),
    (b'{"signed": {}, "signed": {"version": "1"}}', "key 'signed' twice"),
    (b'{"expires": NaN}', "holds NaN"),
    (b'{"expires": Infinity}', "holds Infinity"),
    (b'{"size": 1e999}', "out of range"),
])
def test_json_that_python_parses_but_no_writer_makes_is_refused_in_one_line(document, message):
    with pytest.raises(UntrustedInputError, match=message) as caught:
        loads_json(document, what="channel pointer")
    assert str(caught.value).startswith("channel pointer ") and "\n" not in str(caught.value)


def test_a_regular_file_that_refuses_reads_is_one_line():
    with pytest.raises(UntrustedInputError, match="cannot be read"):
        read_regular_file("/proc/self/mem", what="trust root")


def test_a_proc_file_that_never_ends_is_refused_in_one_line():
    # pagemap claims size 0 and would give gigabytes: cut at the limit, or refused as unreadable
    with pytest.raises(UntrustedInputError, match="over the limit|cannot be read"):
        read_regular_file("/proc/self/pagemap", what="input", limit=1 << 20)
