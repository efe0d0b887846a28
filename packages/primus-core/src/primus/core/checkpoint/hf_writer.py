"""The weights of an HF model directory, written a group of tensors at a time (an exporter
holds one group, never the model): `model.safetensors`, or numbered
`model-0000i-of-0000N.safetensors` files and `model.safetensors.index.json`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

INDEX = "model.safetensors.index.json"


def _nbytes(tensor: Any) -> int:
    nbytes = getattr(tensor, "nbytes", None)  # numpy arrays and torch tensors alike
    return int(nbytes if nbytes is not None else tensor.numel() * tensor.element_size())


def _save(tensors: Mapping[str, Any], path: Path) -> None:
    """One safetensors file of torch tensors or of numpy arrays."""
    first = next(iter(tensors.values()))
    if type(first).__module__.startswith("torch"):
        from safetensors.torch import save_file
    else:
        from safetensors.numpy import save_file
    save_file(dict(tensors), str(path), metadata={"format": "pt"})


class SafetensorsWriter:
    """Writes each `write()` call's tensors as one safetensors file in `out`; `finish()`
    names the files and writes the index."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def write(self, tensors: Mapping[str, Any]) -> None:
        if not tensors:
            return
        path = self.out / f".part-{len(self.files):05d}.safetensors"
        _save(tensors, path)
        self.files.append((path, list(tensors)))
        self.total += sum(_nbytes(t) for t in tensors.values())

    def finish(self) -> None:
        if len(self.files) == 1:
            self.files[0][0].rename(self.out / "model.safetensors")
            return
        weight_map: dict[str, str] = {}
        for number, (path, names) in enumerate(self.files, start=1):
            name = f"model-{number:05d}-of-{len(self.files):05d}.safetensors"
            path.rename(self.out / name)
            weight_map |= dict.fromkeys(names, name)
        index = {
            "metadata": {"total_size": self.total},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (self.out / INDEX).write_text(json.dumps(index, indent=2) + "\n")
