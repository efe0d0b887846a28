"""The errors Primus reports to users, and the did-you-mean helper they share."""

from __future__ import annotations

import contextlib
import difflib
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Origin:
    """Where a config value came from: a file and line, the command line, the environment, a
    default, or a patch."""

    kind: str  # "file" | "cli" | "env" | "default" | "patch"
    file: str | None = None
    line: int | None = None
    detail: str | None = None  # the env var name, the CLI token, or the patch id

    def __str__(self) -> str:
        path = self.file or ""
        if path:
            rel = os.path.relpath(path)
            path = path if rel.startswith("..") else rel
        where = f"{path}:{self.line}" if path and self.line else path
        if self.kind == "file":
            return where
        if self.kind == "env":
            return f"env {self.detail}" + (f" (at {where})" if where else "")
        if self.kind == "patch":
            return f"patch {self.detail}"
        return f"{self.kind} ({clipped(self.detail, DETAIL_WIDTH)})" if self.detail else self.kind


DETAIL_WIDTH = 300  # an origin's detail quoted whole up to this: a command-line token with paths


def clipped(text: str, limit: int = 60) -> str:
    """`text`, its first `limit` characters and `...` where it is longer: a name or a token
    quoted in a message, which a pasted blob would bury."""
    return text if len(text) <= limit else f"{text[:limit]}..."


class PrimusError(Exception):
    """Base of every error Primus reports without a traceback. Exit code 1."""

    exit_code = 1
    label = "error"  # how the CLI introduces the message

    def __init__(self, message: str, origin: Origin | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.origin = origin
        self.hint = hint

    def __str__(self) -> str:
        text = (
            f"{self.origin}: {self.message}" if self.origin and str(self.origin) else self.message
        )
        return f"{text}\n  hint: {self.hint}" if self.hint else text

    def report_key(self) -> str:
        """What the ranks of a launch report once (`launcher.report_once`): the message."""
        return f"{self.label}: {self}"


class ConfigError(PrimusError):
    """Bad input: a config file, an override, a flag. Exit code 2."""

    exit_code = 2


class BackendError(ConfigError):
    """A backend that is unknown, failed to load, or whose upstream is missing or incompatible."""

    exit_code = 2


class PatchError(PrimusError):
    """A patch that failed to register or to apply."""


# Writes a file system refuses whatever is written: full, over quota, read-only.
REFUSED = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
}
_STRERROR = {os.strerror(code): code for code in REFUSED}  # "No space left on device", ...
_QUOTED_PATH = re.compile(r"[\"'](/[^\"'\n]+)[\"']")
PROBE_BYTES = 1 << 20  # what a folder must still take for its file system not to count as full
_HINTS = {
    errno.ENOSPC: "free space on {mount}",
    errno.EDQUOT: "free space within your quota on {mount}",
    errno.EROFS: "make {mount} writable",
}


def _existing_folder(path: Path) -> Path:
    """The nearest folder that exists at or above `path`."""
    path = Path(os.path.abspath(path))
    found = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    return found if found.is_dir() else found.parent


def _mount(folder: Path) -> Path:
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return folder


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.1f} MiB"


class FileSystemError(PrimusError):
    """A write refused because its file system is full (ENOSPC), over quota (EDQUOT) or
    read-only (EROFS), wherever it happened (a checkpoint, metrics, a log, a report): one message
    naming the path and the free space on its file system. Exit code 1; the ranks of a launch
    that all hit it report it once."""

    def __init__(self, code: int, path: Path | str | None) -> None:
        self.code = code
        self.path = str(path) if path is not None else None
        if self.path is None:
            self.mount = None
            super().__init__(f"{REFUSED[code]} (the failed write named no file)")
            return
        folder = _existing_folder(Path(self.path))
        self.mount = _mount(folder)
        try:
            usage = shutil.disk_usage(folder)
            room = f"{_size(usage.free)} free of {_size(usage.total)} on {self.mount}"
        except OSError:
            room = f"on {self.mount}"
        super().__init__(
            f"{REFUSED[code]} writing {self.path} ({room})",
            hint=_HINTS[code].format(mount=self.mount)
            + " (or move the workspace to another file system), then run the same command "
            "again: a training run resumes from its last complete checkpoint",
        )

    def report_key(self) -> str:
        """Every rank writing to a full file system fails, each at its own file: once a mount."""
        return f"{self.label}: {REFUSED[self.code]} on {self.mount}"


def linked(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception it holds: its cause and context, an exception group's members,
    and exceptions among its args (torch.distributed.checkpoint's CheckpointException holds
    each rank's failure there, as rank -> (exception, traceback))."""

    def held(values: Iterable[object], depth: int = 2) -> Iterator[BaseException]:
        for value in values:
            if isinstance(value, BaseException):
                yield value
            elif depth and isinstance(value, dict):
                yield from held(value.values(), depth - 1)
            elif depth and isinstance(value, tuple | list):
                yield from held(value, depth - 1)

    seen: set[int] = set()
    todo = [exc]
    while todo and len(seen) < 200:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        todo += list(getattr(current, "exceptions", None) or ())
        todo += list(held(current.args))


def _refused_code(exc: BaseException) -> tuple[int, str | None] | None:
    """(errno, the path it names) when `exc` itself is a refused write: an OSError with that
    errno, or a message with its text (JAX, orbax and TensorStore pass only the text on)."""
    if isinstance(exc, OSError) and exc.errno in REFUSED:
        return exc.errno, os.fsdecode(exc.filename) if exc.filename is not None else None
    text = str(exc)
    for words, code in _STRERROR.items():
        at = text.find(words)
        if at >= 0:
            paths = _QUOTED_PATH.findall(text[:at])
            return code, paths[-1] if paths else None
    return None


def _refused_now(folder: Path) -> int | None:
    """The errno with which `folder`'s file system refuses a probe of PROBE_BYTES (removed at
    once), or None when it takes it: whether a write there fails now."""
    where = _existing_folder(folder)
    try:
        fd, probe = tempfile.mkstemp(dir=where, prefix=".primus-probe-")
    except OSError as e:
        return e.errno if e.errno in REFUSED else None
    try:
        written = os.write(fd, bytes(PROBE_BYTES))
        return errno.ENOSPC if written < PROBE_BYTES else None
    except OSError as e:
        return e.errno if e.errno in REFUSED else None
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(probe)


def filesystem_error(exc: BaseException, folder: Path | None = None) -> FileSystemError | None:
    """The FileSystemError behind `exc`, or None. Found in `exc` or what it holds (a refused
    write's errno or its text), naming the file it names, else `folder`; else, when `folder`
    is given and its file system now refuses a write, that (an upstream that lost the error
    on the way: a checkpoint writer that passes on only the exception's type). A PrimusError
    other than a FileSystemError is its own report: None."""
    if isinstance(exc, FileSystemError):
        return exc
    if isinstance(exc, PrimusError):
        return None
    for held in linked(exc):
        if isinstance(held, FileSystemError):
            return held
        found = _refused_code(held)
        if found is not None:
            return FileSystemError(found[0], found[1] or folder)
    refusing = _refused_now(folder) if folder is not None else None
    return FileSystemError(refusing, folder) if refusing is not None else None


@contextlib.contextmanager
def refused_writes(folder: Path | str) -> Iterator[None]:
    """Around a backend's save into `folder`: an exception that a full, over-quota or read-only
    file system caused leaves the block as a FileSystemError naming the file, else `folder`."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:
        refused = filesystem_error(exc, Path(folder))
        if refused is None:
            raise
        raise refused from exc


def did_you_mean(word: str, candidates: Iterable[str], n: int = 3) -> str:
    """A ' (did you mean: a, b?)' suffix, or '' when nothing is close."""
    close = difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)
    return f" (did you mean: {', '.join(close)}?)" if close else ""


def json_type(value: object) -> str:
    """The JSON name of a parsed JSON value's type, for messages about JSON input: null,
    boolean, number, string, array or object."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__
