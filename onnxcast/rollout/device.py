"""The device folder (``DEST`` of ``edge pull``), walked by descriptor so that nothing below it
is ever followed through a symlink.

``DEST`` itself is opened once, as the user named it (a ``DEST`` that is a symlink to a
folder works: everything happens in that folder). Every name below it is opened relative to
its parent's descriptor with ``O_NOFOLLOW``: a ``versions/``, ``trust/`` or ``.pull.lock``
planted as a symlink is refused on one line, never written through, and removal only
ever unlinks entries of folders opened this way (``shutil.rmtree(name, dir_fd=...)`` refuses
a symlinked root and never follows one below it). The one symlink the device folder has on
purpose, ``current`` (and ``previous``), is read with ``readlink`` and must be
``versions/<version>``; it is never followed by the code that writes or removes.

Before this, ``Path.resolve()`` and ``shutil.rmtree(DEST/versions/x)`` followed a symlinked
``versions/`` and deleted a folder outside DEST (issue 18, item 3).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from onnxcast.base.errors import ConfigError
from onnxcast.base.untrusted import MAX_METADATA_BYTES, UntrustedInputError, read_regular_file
from onnxcast.rollout.store import check_name, replace_at

VERSIONS = "versions"
CURRENT = "current"
PREVIOUS = "previous"
LOCK = ".pull.lock"
STAGING_PREFIX = ".staging-"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class DeviceFolderError(ConfigError):
    """The device folder holds something a pull never makes (a symlink, a file for a folder):
    refused, nothing changed; the user removes it."""


class DeviceFolder:
    """An open device folder: ``fd`` is DEST's descriptor, ``path`` only names it in messages."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    # --- folders ----------------------------------------------------------------------------
    @contextmanager
    def folder(self, name: str, *, create: bool) -> Iterator[int | None]:
        """The descriptor of ``DEST/name`` (a real folder, never a symlink); None when it is
        missing and ``create`` is False."""
        fd = self.open_folder(self.fd, name, create=create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def open_folder(self, parent: int, name: str, *, create: bool, where: str | None = None) -> int | None:
        where = where or name
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                return None
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:  # a concurrent mkdir, or a dangling symlink (refused just below)
                pass
            fd = self.open_folder(parent, name, create=False, where=where)
            if fd is None:
                self._refuse(where, "was removed while it was made")
            return fd
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self._refuse(where, "is a symbolic link or not a folder")
            raise ConfigError(f"{self.path / where}: cannot open ({exc.strerror})") from None

    def _refuse(self, where: str, why: str):
        raise DeviceFolderError(f"{self.path / where} {why}; a device folder never follows symlinks: "
                                "remove it (nothing was changed)")

    # --- files ------------------------------------------------------------------------------
    def read(self, folder: int, name: str, where: str, limit: int = MAX_METADATA_BYTES) -> bytes | None:
        """A regular file of at most ``limit`` bytes in ``folder`` (never through a symlink);
        None when missing."""
        try:
            return read_regular_file(name, what="device file", limit=limit, follow_symlinks=False, dir_fd=folder)
        except UntrustedInputError as exc:
            if "does not exist" in str(exc):
                return None
            raise DeviceFolderError(f"{self.path / where}: {_reason(exc)}; remove it (nothing was changed)") from None

    def sha256(self, folder: int, name: str) -> str | None:
        """The sha256 of a regular file in ``folder`` (streamed, never through a symlink)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return hashlib.file_digest(f, "sha256").hexdigest()

    def write_atomic(self, folder: int, name: str, data: bytes) -> None:
        """Replace ``folder/name`` with ``data``: a synced temporary file, then a rename (a
        symlink at ``name`` is replaced, never written through)."""
        try:
            replace_at(folder, name, data)
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot write {name} ({exc.strerror})") from None
        os.fsync(folder)

    # --- the lock ---------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[None]:
        """An exclusive ``flock`` on ``DEST/.pull.lock`` (one pull at a time; freed if we die)."""
        import fcntl

        try:
            fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                         0o644, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._refuse(LOCK, "is a symbolic link")
            raise ConfigError(f"{self.path / LOCK}: cannot open ({exc.strerror})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                self._refuse(LOCK, "is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    # --- what is installed ------------------------------------------------------------------
    def link_target(self, name: str) -> str | None:
        """The version folder ``DEST/name`` (``current``, ``previous``) points to, if it is a
        symlink to ``versions/<version folder>``; None if missing or anything else."""
        try:
            target = os.readlink(name, dir_fd=self.fd)
        except OSError:
            return None
        parts = target.split("/")
        if len(parts) != 2 or parts[0] != VERSIONS:
            return None
        try:
            return check_name("version folder", parts[1])
        except ConfigError:
            return None

    # --- removal ----------------------------------------------------------------------------
    def remove(self, folder: int, name: str) -> None:
        """Remove ``folder/name``: a symlink or file is unlinked (its target untouched), a
        folder removed by descriptor (rmtree with ``dir_fd`` follows no symlink)."""
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(info.st_mode):
            if not shutil.rmtree.avoids_symlink_attacks:  # only the fd-based rmtree (Linux, macOS) is safe
                raise ConfigError(f"{self.path}: this platform's rmtree follows symlinks; remove {name} by hand")
            shutil.rmtree(name, dir_fd=folder)
        else:
            os.unlink(name, dir_fd=folder)


@contextmanager
def open_device_folder(dest: str | Path, *, create: bool) -> Iterator[DeviceFolder]:
    """DEST opened as a folder (created when ``create``); DeviceFolderError in one line when
    it is not one."""
    path = Path(dest).absolute()
    if create:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot use as the device folder ({exc.strerror or exc})") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such device folder") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot use as the device folder ({exc.strerror})") from None
    try:
        yield DeviceFolder(path, fd)
    finally:
        os.close(fd)


def _reason(exc: UntrustedInputError) -> str:
    """The refusal without the ``device file 'name'`` prefix (the caller names the path)."""
    text = str(exc)
    head, sep, tail = text.partition("' ")
    return tail if sep and head.startswith("device file '") else text
