"""Summaries of torch.distributed.checkpoint (DCP) folders from their `.metadata` alone, for the
backends that save with DCP. Imports torch when called; no tensor is loaded."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any


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
