"""What an onnxcast run owns in its output folder, so that a run replaces nothing else.

``onnxcast pipeline --out DIR`` publishes ``config.json``, ``data/``, ``quality/``, ``models/``
and ``report.json`` (or ``failed-report.json``) into DIR. DIR is often a folder the user works
in: the first release, run with ``--out .`` in a project holding ``data/meters.csv``, replaced
``data/`` whole and the input was gone. Now DIR holds a record, :data:`RECORD`, of every file
and folder onnxcast wrote there, and a run may replace an entry only when the record lists it
and everything under it, as the same kind (file or folder) it is on disk:

- an entry that is not in the record (the user's ``data/``, ``report.json``, a file the user
  added to ``models/``) is never deleted or replaced: the run is refused in one line naming it,
  before anything is read or trained (:meth:`OwnedOutput.check`);
- a symbolic link is never written by onnxcast, so a link at any of those names, or anywhere
  under them, refuses the run too: nothing follows it, nothing removes it;
- the record is written before anything is moved into DIR and listing both the old and the new
  entries (:meth:`OwnedOutput.claim`), then trimmed to what is there (:meth:`OwnedOutput.settle`),
  so a run killed half-way through publishing leaves nothing unrecorded.

An output written before this record existed has none, and is refused like any other folder:
onnxcast cannot tell it from the user's own files by their names (it writes ``data/`` and
``config.json``, names any project may hold). Removing it once is the user's call.

DIR itself may be a symbolic link (the user named it, as with ``--out /mnt/big``): the rule
applies inside the folder it points to.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from onnxcast import __version__
from onnxcast.base.errors import ConfigError
from onnxcast.base.files import write_json
from onnxcast.base.untrusted import UntrustedInputError, file_kind, read_json_file

RECORD = ".onnxcast-output.json"
FILE, FOLDER = "file", "folder"
# A fleet of 100,000 series writes some thousands of files; 64 MiB holds a million paths.
MAX_RECORD_BYTES = 64 * 1024 * 1024


class OutputNotOwnedError(ConfigError):
    """The output folder holds an entry onnxcast did not write where a run would write: refused."""


@dataclass(frozen=True)
class OwnedOutput:
    """The output folder ``folder`` and what its record says onnxcast wrote there: run-relative
    POSIX paths mapped to :data:`FILE` or :data:`FOLDER`."""

    folder: Path
    entries: dict[str, str] = field(default_factory=dict)
    recorded: bool = False  # the folder has a record (an onnxcast run published or staged there)

    @classmethod
    def read(cls, folder: Path) -> OwnedOutput:
        """The record of ``folder``; an empty one when it has none. A record that is not a
        regular file of onnxcast's form refuses the run (it would claim the user's files)."""
        path = folder / RECORD
        if not os.path.lexists(path):
            return cls(folder)
        try:
            document = read_json_file(path, what="the ownership record", limit=MAX_RECORD_BYTES,
                                      follow_symlinks=False)
        except UntrustedInputError as exc:
            raise OutputNotOwnedError(f"--out {folder}: {exc}; move it away or choose another --out") from None
        entries = document.get("entries") if isinstance(document, dict) else None
        if not isinstance(entries, dict) or not all(
                isinstance(k, str) and v in (FILE, FOLDER) for k, v in entries.items()):
            raise OutputNotOwnedError(f"--out {folder}: {path} is not an onnxcast ownership record "
                                      "(no 'entries' of files and folders); move it away or choose another --out")
        return cls(folder, dict(entries), recorded=True)

    def check(self, names: Iterable[str], wholly: Iterable[str] = ()) -> None:
        """Refuse (:class:`OutputNotOwnedError`, naming the path) when any top-level entry
        ``names`` of the folder exists and it, or anything under it, is not onnxcast's.
        A folder of ``wholly`` is onnxcast's with all it holds when the record lists it: the
        staging folder, whose contents a killed run never got to record."""
        wholly = set(wholly)
        for name in names:
            fault = self._first_foreign(name, whole=name in wholly)
            if fault is not None:
                path, why = fault
                raise OutputNotOwnedError(f"--out {self.folder}: {path} {why}; a run replaces only onnxcast's own "
                                          "earlier output: move it away or choose another --out")

    def claim(self, entries: dict[str, str]) -> OwnedOutput:
        """Add ``entries`` to the record, on disk first: called before they are moved in."""
        claimed = OwnedOutput(self.folder, {**self.entries, **entries}, recorded=True)
        claimed._write()
        return claimed

    def settle(self) -> OwnedOutput:
        """Keep in the record only the entries that are still there, as the kind recorded; no
        record at all when none is (a run refused on its data leaves the folder as it was)."""
        kept = {name: kind for name, kind in self.entries.items() if _kind(self.folder / name) == kind}
        if not kept:
            (self.folder / RECORD).unlink(missing_ok=True)
            return OwnedOutput(self.folder)
        settled = OwnedOutput(self.folder, kept, recorded=True)
        settled._write()
        return settled

    def _write(self) -> None:
        write_json(self.folder / RECORD, {
            "what": "the files and folders onnxcast wrote in this folder; a run replaces only these "
                    "(onnxcast/pipeline/ownership.py)",
            "onnxcast_version": __version__, "entries": dict(sorted(self.entries.items()))})

    def _first_foreign(self, name: str, whole: bool = False) -> tuple[Path, str] | None:
        """The first path under ``name`` onnxcast did not write, and why; None when it is all its own."""
        path = self.folder / name
        kind = _kind(path)
        if kind is None:
            return None
        if kind not in (FILE, FOLDER):
            return path, f"is {kind}" + (", which onnxcast never writes nor follows" if kind == _LINK else "")
        if self.entries.get(name) != kind:
            return path, (f"was not written by onnxcast (not in {RECORD})" if self.recorded else
                          f"was not written by onnxcast (this folder has no {RECORD}, the record of what "
                          "onnxcast wrote here)")
        if kind == FOLDER and not whole:
            for relative, found in scan(path, prefix=name).items():
                if found not in (FILE, FOLDER):
                    return self.folder / relative, f"is {found}, which onnxcast never writes nor follows"
                if self.entries.get(relative) != found:
                    return self.folder / relative, f"was not written by onnxcast (not in {RECORD})"
        return None


_LINK = "a symbolic link"


def scan(folder: Path, prefix: str) -> dict[str, str]:
    """Every path under ``folder`` (``prefix/...``, POSIX) and its kind: :data:`FILE`,
    :data:`FOLDER`, or the words for anything else (``a symbolic link``...); links are never
    followed."""
    found: dict[str, str] = {}
    pending = [(folder, prefix)]
    while pending:
        directory, relative = pending.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                name = f"{relative}/{entry.name}"
                kind = _kind(Path(entry.path))
                found[name] = kind
                if kind == FOLDER:
                    pending.append((Path(entry.path), name))
    return found


def entries_of(root: Path, names: Iterable[str]) -> dict[str, str]:
    """The record entries of the top-level ``names`` under ``root`` (a staged run): each name
    and everything under it."""
    out: dict[str, str] = {}
    for name in names:
        kind = _kind(root / name)
        if kind is None:
            continue
        out[name] = kind
        if kind == FOLDER:
            out.update(scan(root / name, prefix=name))
    return out


def _kind(path: Path) -> str | None:
    """:data:`FILE`, :data:`FOLDER`, None when nothing is there, else what it is in words."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return FILE
    if stat.S_ISDIR(mode):
        return FOLDER
    return file_kind(mode)
