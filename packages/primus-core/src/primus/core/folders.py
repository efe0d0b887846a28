"""Whether a folder can take files: the one probe the run directory and preflight's workspace
use before any work."""

from __future__ import annotations

import tempfile
from pathlib import Path


def unwritable(folder: Path) -> str | None:
    """Make `folder` (and its parents) and write a probe file into it, removed at once: None
    if that worked, else why not (a regular file on the way, a read-only file system, ...)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".primus-probe-"):
            return None
    except OSError as e:
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        if not existing.is_dir():
            return f"{existing} is not a folder"
        return f"{e.strerror or e}" + (f" ({e.filename})" if e.filename else "")
