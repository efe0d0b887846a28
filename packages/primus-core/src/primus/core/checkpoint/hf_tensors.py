"""The tensors of an HF model directory, read one at a time and checked (HFTensors), and
written a shard at a time (SafetensorsWriter): neither holds the model."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primus.core.checkpoint.hf import safetensors_files, safetensors_header
from primus.core.errors import ConfigError

INDEX = "model.safetensors.index.json"
SHARD_BYTES = 1 << 30  # the size of the safetensors files an export writes


FLOAT_DTYPES = ("F32", "F16", "BF16")  # safetensors' names of the dtypes a model's weights have


class HFTensors:
    """The tensors of an HF model directory by name, each read on demand with safetensors'
    `safe_open(framework=...)` ("pt": torch tensors, "flax": JAX arrays). Every tensor's dtype
    is checked up front and its shape when read: a ConfigError names the file and tensor."""

    def __init__(self, folder: Path, framework: str) -> None:
        self.framework = framework
        self.files: dict[str, Path] = {}
        paths = safetensors_files(folder)
        self.where = (
            folder / INDEX
            if (folder / INDEX).is_file()
            else paths[0]
            if len(paths) == 1
            else folder
        )
        for path in paths:
            for name, entry in safetensors_header(path).items():
                self.files[name] = path
                if entry["dtype"] not in FLOAT_DTYPES:
                    self._bad(name, f"has dtype {entry['dtype']}; expected a floating-point dtype "
                                    f"({', '.join(FLOAT_DTYPES)})")  # fmt: skip

    def _bad(self, name: str, problem: str) -> None:
        raise ConfigError(f"{self.files.get(name, self.where)}: tensor '{name}' {problem}")

    def get(self, name: str, shape: tuple[int, ...]) -> Any:
        """Tensor `name`, which must have `shape` (config.json's)."""
        from safetensors import safe_open

        if name not in self.files:
            raise ConfigError(f"{self.where}: tensor '{name}' is missing")
        with safe_open(self.files[name], self.framework) as f:
            found = tuple(f.get_slice(name).get_shape())
            if found != tuple(shape):
                self._bad(name, f"has shape {list(found)}; config.json needs {list(shape)}")
            return f.get_tensor(name)


def _nbytes(tensor: Any) -> int:
    nbytes = getattr(tensor, "nbytes", None)  # numpy arrays and torch tensors alike
    return int(nbytes if nbytes is not None else tensor.numel() * tensor.element_size())


def _save(tensors: Mapping[str, Any], path: Path) -> None:
    """One safetensors file of torch tensors or of numpy arrays."""
    first = next(iter(tensors.values()))
    if type(first).__module__.startswith("torch"):
        import safetensors.torch as library
    else:
        import safetensors.numpy as library  # type: ignore[no-redef]
    library.save_file(dict(tensors), str(path), metadata={"format": "pt"})


class SafetensorsWriter:
    """Writes tensors as `model.safetensors`, or as numbered `model-0000i-of-0000N.safetensors`
    files of about `shard_bytes` each and `model.safetensors.index.json`."""

    def __init__(self, out: Path, shard_bytes: int = SHARD_BYTES) -> None:
        self.out, self.shard_bytes = out, shard_bytes
        self.shard: dict[str, Any] = {}
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, tensors: Mapping[str, Any]) -> None:
        """Adds `tensors` to the current file, first writing that out if they would take it
        past shard_bytes."""
        size = sum(_nbytes(t) for t in tensors.values())
        if self.shard and sum(_nbytes(t) for t in self.shard.values()) + size > self.shard_bytes:
            self._flush()
        self.shard |= tensors
        self.total += size

    def _flush(self) -> None:
        path = self.out / f".part-{len(self.files):05d}.safetensors"
        _save(self.shard, path)
        self.files.append((path, list(self.shard)))
        self.shard = {}

    def finish(self) -> None:
        """Writes the last file, names them all, and writes the index."""
        if self.shard:
            self._flush()
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
