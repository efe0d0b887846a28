"""Whether a folder can take files: the one probe the run directory and preflight's workspace
use before any work; and whether the temporary folder leaves room for multiprocessing's sockets."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from primus.core.errors import ConfigError, Origin

# Python's multiprocessing binds Unix sockets at TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX (data-loader
# workers share tensors through them); Linux takes a socket path of at most 107 bytes.
SOCKET_PATH_MAX = 107
SOCKET_SUFFIX = len("/pymp-12345678/listener-12345678")
PROBE = ".primus-probe-"


def not_a_folder(folder: Path) -> str | None:
    """Why `folder` cannot hold a file written into it (a file there, or nothing), or None."""
    if folder.is_dir():
        return None
    return f"{folder} is not a folder" if folder.exists() else f"no folder {folder}"


def is_stream(path: Path) -> bool:
    """Whether `path` is a FIFO or a character device (`--json /dev/stdout`, a named pipe): a
    write goes into it, as a shell's `>` would, never replaces it."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def not_replaceable(path: Path) -> str | None:
    """Why a new file must not be renamed over `path` (a folder there, or a socket or block
    device, which the rename would replace rather than write to), or None. A stream
    (`is_stream`) is written into instead: callers ask that first."""
    if path.is_dir():
        return "it is a folder"
    if path.exists() and not path.is_file():
        return "it is not a regular file (a socket or a block device)"
    return None


def not_a_file(path: Path) -> str | None:
    """Why a file cannot be written at `path` (`not_replaceable`, or no folder to hold it), or
    None: the check a command makes before its work, for a report it writes at the end (a
    probe file in the folder: a read-only one is found too). A stream is written into, never
    made in its folder (/dev takes no new file)."""
    if is_stream(path):
        return None
    return (
        not_replaceable(path) or not_a_folder(path.parent) or unwritable(path.parent, create=False)
    )


def unwritable(folder: Path, create: bool = True) -> str | None:
    """Make `folder` (and its parents) and write a probe file into it, removed at once: None
    if that worked, else why not (a regular file on the way, a read-only file system, ...).
    With `create` false nothing is made: the probe goes into the nearest existing folder."""
    try:
        if create:
            folder.mkdir(parents=True, exist_ok=True)
        probed = folder if create else next(p for p in (folder, *folder.parents) if p.exists())
        with tempfile.TemporaryFile(dir=probed, prefix=PROBE):
            return None
    except OSError as e:
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        if not existing.is_dir():
            return f"{existing} is not a folder"
        refused = e.filename
        if refused and Path(refused).name.startswith(PROBE):  # the folder refused the probe
            refused = Path(refused).parent
        return f"{e.strerror or e}" + (f" ({refused})" if refused else "")


def cache_dir() -> Path:
    """Primus's user cache: $PRIMUS_CACHE_DIR, else $XDG_CACHE_HOME/primus (~/.cache/primus)."""
    if os.environ.get("PRIMUS_CACHE_DIR"):
        return Path(os.environ["PRIMUS_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "primus"


def temp_dir_too_long() -> str | None:
    """None if multiprocessing's socket paths fit under the temporary folder, else why not.
    Where they don't, a worker's socket fails in a queue's feeder thread and the run hangs."""
    temp = tempfile.gettempdir()
    length = len(os.fsencode(temp))
    if length <= SOCKET_PATH_MAX - SOCKET_SUFFIX:
        return None
    return (
        f"the temporary folder {temp} is {length} bytes long; Python's "
        f"multiprocessing makes Unix sockets {SOCKET_SUFFIX} bytes deeper, and Linux takes "
        f"{SOCKET_PATH_MAX}: data-loader workers could not share tensors and the run would hang"
    )


def check_temp_dir() -> None:
    """A ConfigError where the temporary folder is too long for multiprocessing's sockets (a
    hang later)."""
    why = temp_dir_too_long()
    if why is not None:
        raise ConfigError(
            why,
            Origin("env", detail="TMPDIR") if os.environ.get("TMPDIR") else None,
            hint="point TMPDIR at a shorter folder",
        )
