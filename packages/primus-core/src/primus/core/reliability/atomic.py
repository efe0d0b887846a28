"""Files Primus writes: whole or not at all.

- `atomic_file(path)` / `write_atomic(path, data)` / `write_json(path, value)`: every file Primus writes in one piece
  (reports, the resolved config, provenance, benchmark and projection records, the small files
  of an HF export) goes to a temporary file in the same folder, is fsync'ed and renamed over
  `path` (`os.replace`). Any failure (a full disk, a read-only file system, a kill) leaves the
  old file as it was, or none, and no temporary file behind: never an empty or half-written one.
- `staged_folder(final)`: a folder written whole (an HF export, a model): filled beside
  `final` and renamed into place, an old `final` swapped out only once the new one is whole.
- `append_line(path, line)` / `append_record(fd, data, path)`: one record onto an append-only
  stream (metrics.jsonl, a log file) in one `os.write`. A write the file system cuts short is
  taken back (the file truncated to where it was), so the stream never ends in a torn line.

An OSError from either names `path` (`exc.filename`), so that a full disk is reported with it
(`primus.core.errors.filesystem_error`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Literal

from primus.core.errors import ConfigError
from primus.core.folders import is_stream, not_a_folder, not_replaceable, unwritable


def _umask() -> int:
    """The process's umask (read, not set: setting it would race other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith("Umask:"))[6:], 8)
    return 0o022


def _named(exc: OSError, path: Path) -> OSError:
    """`exc` with `path` as its file name (an OSError from a write names no file)."""
    if exc.filename is not None or exc.errno is None:
        return exc
    named = OSError(exc.errno, exc.strerror, str(path))  # the errno's subclass, as raised
    named.__cause__ = exc
    return named


def sync_folder(folder: Path) -> None:
    """fsync `folder` itself, so that a rename or a new file in it is on disk (where the file
    system allows opening a folder for that)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_file(
    path: Path | str, mode: Literal["w", "wb"] = "w", encoding: str = "utf-8"
) -> Iterator[IO[Any]]:
    """A file to write `path`'s new content into: a temporary file beside `path`, fsync'ed and
    renamed over `path` when the block ends without an error, removed when it raises. The file
    gets the mode an ordinary new file would (an existing `path` keeps its own). A FIFO or a
    character device (`is_stream`) is written in place; a symbolic link, the file it names (as
    a shell's `>` writes it: the link stays)."""
    path = Path(path)
    if is_stream(path):
        with path.open(mode, encoding=None if "b" in mode else encoding) as stream:
            yield stream
        return
    path = path.resolve() if path.is_symlink() else path
    if why := not_replaceable(path):
        raise ConfigError(f"cannot write {path}: {why}", hint="name a file to write")
    try:
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):  # where it was told to write
            why = not_a_folder(path.parent) or exc.strerror
            raise ConfigError(f"cannot write {path}: {why}",
                              hint="name a file in a folder you can write") from None  # fmt: skip
        raise _named(exc, path)  # noqa: B904 - the cause is set, the context is the same
    try:
        try:
            os.fchmod(fd, path.stat().st_mode & 0o7777)
        except FileNotFoundError:
            os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        if isinstance(exc, OSError):
            raise _named(exc, path)  # noqa: B904
        raise
    sync_folder(path.parent)


def check_replaceable(final: Path, replace: bool) -> None:
    """A ConfigError unless `staged_folder(final, replace)` can write `final`: a folder (or
    nothing) there, empty unless `replace`, in a parent this process can write, and neither
    the current folder nor one that holds it ('', '.', '..', '/')."""
    here = Path.cwd().resolve()
    if final.resolve() in (here, *here.parents):
        raise ConfigError(f"{final} is the current folder or holds it",
                          hint="name a folder of its own to write")  # fmt: skip
    if final.exists() and not final.is_dir():
        raise ConfigError(f"{final} is a file, not a folder", hint="name a folder to write")
    if final.is_dir() and any(final.iterdir()) and not replace:
        raise ConfigError(f"{final} exists and is not empty", hint="pass --force to replace it")
    why = unwritable(final.parent)
    if why is not None:
        raise ConfigError(f"cannot write {final}: {why}")


@contextlib.contextmanager
def staged_folder(final: Path, replace: bool = False) -> Iterator[Path]:
    """An empty folder beside `final` to fill; renamed to `final` when the block succeeds and
    removed when it fails, so a reader never sees a half-written `final`. An existing `final`
    (an empty folder, or any folder with `replace`) is swapped out only once the new one is
    whole (two renames): a failure, or a kill before the swap, leaves it as it was."""
    staging = final.with_name(f".{final.name}.partial-{os.getpid()}")
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    for leftover in (staging, old):
        shutil.rmtree(leftover, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        if final.is_dir() and (replace or not any(final.iterdir())):
            final.rename(old)
        staging.rename(final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if old.exists() and not final.exists():
            old.rename(final)
        raise
    shutil.rmtree(old, ignore_errors=True)
    sync_folder(final.parent)


def write_atomic(path: Path | str, data: str | bytes) -> None:
    """Replace `path`'s content with `data` in one step (`atomic_file`): a reader, or the file
    after any failure, has the old content or the new, never a part."""
    if isinstance(data, str):
        with atomic_file(path, "w") as out:
            out.write(data)
    else:
        with atomic_file(path, "wb") as out:
            out.write(data)


def write_json(path: Path | str, value: Any, **dumps: Any) -> None:
    """`value` as indented JSON with a final newline, written atomically (`write_atomic`)."""
    write_atomic(path, json.dumps(value, indent=2, **dumps) + "\n")


def append_record(fd: int, data: bytes, path: Path | str) -> None:
    """Append `data` (one whole record, newline included) to the file open at `fd` (opened
    with O_APPEND) in one write. A write cut short is finished, and where that fails, the
    part written is taken back (the file truncated to its size before, unless another writer
    appended since): no torn record. The OSError names `path`."""
    start = os.fstat(fd).st_size
    done = 0
    try:
        while done < len(data):
            written = os.write(fd, data[done:])
            if not written:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += written
    except OSError as exc:
        with contextlib.suppress(OSError):
            if done and os.fstat(fd).st_size == start + done:
                os.ftruncate(fd, start)
        raise _named(exc, Path(path))  # noqa: B904


def append_line(path: Path | str, line: str) -> None:
    """Append `line` (a newline added) to `path`, created if missing (`append_record`)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        append_record(fd, (line + "\n").encode(), path)
    finally:
        os.close(fd)
