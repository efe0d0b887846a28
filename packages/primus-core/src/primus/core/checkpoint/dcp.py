"""Summaries of torch.distributed.checkpoint (DCP) folders from their `.metadata` alone, for the
backends that save with DCP, and the error for one whose files cannot be read. Imports torch
when called; no tensor is loaded."""

from __future__ import annotations

import json
import math
import pickle
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.core.errors import PrimusError, linked

# what reading a checkpoint file that was cut short or overwritten raises (DCP holds each
# rank's in a CheckpointException; orbax passes on TensorStore's codes as text)
DAMAGE = (EOFError, pickle.UnpicklingError, json.JSONDecodeError)
DAMAGE_CODES = ("OUT_OF_RANGE:", "DATA_LOSS:")


def dcp_summary(folder: Path, is_model: Callable[[str], bool]) -> dict[str, Any]:
    """Files, bytes, tensors, dtypes and the parameter count of the keys `is_model` accepts."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    tensors = {k: v for k, v in metadata.items() if isinstance(v, TensorStorageMetadata)}
    dtypes = Counter(str(v.properties.dtype).removeprefix("torch.") for v in tensors.values())
    files = list(folder.glob("*.distcp"))
    return {
        "files": len(files),
        "bytes": sum(p.stat().st_size for p in folder.iterdir() if p.is_file()),
        "tensors": len(tensors),
        "model_tensors": sum(1 for k in tensors if is_model(k)),
        "model_parameters": sum(math.prod(v.size) for k, v in tensors.items() if is_model(k)),
        "dtypes": dict(sorted(dtypes.items())),
    }


def numbered(folder: Path, prefix: str) -> dict[int, Path]:
    """The `<prefix>N` subfolders of `folder` (N an integer), by N in increasing order; none
    where `folder` is not a folder (a run that saved nothing yet)."""
    if not folder.is_dir():
        return {}
    found = {
        int(p.name.removeprefix(prefix)): p
        for p in folder.iterdir()
        if p.is_dir() and p.name.startswith(prefix) and p.name.removeprefix(prefix).isdigit()
    }
    return dict(sorted(found.items()))


def damage(exc: BaseException) -> BaseException | None:
    """The error of a damaged checkpoint file that `exc` is or holds (`linked`), or None when
    `exc` is another failure."""
    return next(
        (e for e in linked(exc) if isinstance(e, DAMAGE) or str(e).startswith(DAMAGE_CODES)), None
    )


def read_metadata(folder: Path | str) -> Any:
    """DCP's `.metadata` of the checkpoint `folder`, or None where it has none; the error naming
    the folder (`damaged`) where that file is cut short or overwritten. Read before DCP's own
    load, which logs such an error with its traceback and raises another that only quotes it."""
    if not (Path(folder) / ".metadata").is_file():
        return None
    from torch.distributed.checkpoint import FileSystemReader

    try:
        return FileSystemReader(str(folder)).read_metadata()
    except Exception as exc:
        if (cause := damage(exc)) is None:
            raise
        raise damaged(folder, cause) from exc


def damaged(folder: Path | str, cause: BaseException) -> PrimusError:
    """The error for the checkpoint `folder` whose files cannot be read (`cause`: `damage`'s)."""
    said = (str(cause).strip().splitlines() or [""])[0][:200]
    what = f"{type(cause).__name__}: {said}" if said else type(cause).__name__
    return PrimusError(
        f"the checkpoint {folder} cannot be read ({what})",
        hint=f"a file in it may be damaged or cut short: move {folder} out of "
        f"{Path(folder).parent} to resume from the checkpoint before it, or start another run "
        "(another exp_name)",
    )
