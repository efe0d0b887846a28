"""The tensors of an HF model directory, read one at a time and checked (HFTensors), and
written one at a time into files laid out up front (SafetensorsWriter): neither holds the
model."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from primus.core.checkpoint.hf import DTYPE_BYTES, INDEX, safetensors_files, safetensors_header
from primus.core.errors import ConfigError
from primus.core.progress import ProgressLine
from primus.core.reliability.atomic import write_json

SHARD_BYTES = 4 << 30  # the most an export puts in one safetensors file
# safetensors' names of the dtypes a model's weights have
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# stored tensors a model may leave unread: RoPE's cached frequencies, a tied LM head's copy
UNREAD_OK = ("rotary_emb.inv_freq", "lm_head.weight")
FINITE_BLOCK = 1 << 20  # elements checked for NaN and Inf at once: a bounded temporary


class HFTensors:
    """The tensors of an HF model directory by name, each read on demand: `framework="pt"`
    gives torch tensors (safetensors' safe_open), `"numpy"` numpy arrays read straight from
    the file (BF16 as ml_dtypes' bfloat16), keeping no mapping of it. Every tensor's dtype is
    checked up front, its shape before it is read and its values (no NaN or Inf) as it is
    read: a ConfigError names file and tensor. A read that takes long shows its progress
    (`progress`, of the tensors `check_unread` names the model's)."""

    def __init__(self, folder: Path, framework: str) -> None:
        self.framework = framework
        self.entries: dict[str, tuple[Path, int, dict[str, Any]]] = {}  # file, data start
        self.progress = ProgressLine(0, "HF weights read")
        paths = safetensors_files(folder)
        self.where = (
            folder / INDEX
            if (folder / INDEX).is_file()
            else paths[0]
            if len(paths) == 1
            else folder
        )
        for path in paths:
            with path.open("rb") as f:
                start = 8 + struct.unpack("<Q", f.read(8))[0]
            for name, entry in safetensors_header(path).items():
                self.entries[name] = (path, start, entry)
                if entry["dtype"] not in FLOAT_DTYPES:
                    raise ConfigError(f"{path}: tensor '{name}' has dtype {entry['dtype']}; "
                                      f"expected a floating-point dtype ({', '.join(FLOAT_DTYPES)})")  # fmt: skip
        self.progress.total = sum(tensor_bytes(entry) for _, _, entry in self.entries.values())

    def check_unread(self, names: Iterable[str]) -> None:
        """A ConfigError naming the first stored tensor not among `names` (those the model
        reads), before any is read: weights that config.json does not describe would be
        dropped unseen."""
        wanted = set(names)
        extra = [n for n in self.entries if n not in wanted and not n.endswith(UNREAD_OK)]
        self.progress.total = sum(
            tensor_bytes(e) for n, (_, _, e) in self.entries.items() if n in wanted
        )
        if extra:
            more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
            raise ConfigError(
                f"{self.where}: tensor '{extra[0]}'{more} has no place in the model "
                "config.json describes",
                hint="config.json does not match these weights (num_hidden_layers, biases?)",
            )

    def get(self, name: str, shape: tuple[int, ...] | list[int]) -> Any:
        """Tensor `name`, which must have `shape` (config.json's)."""
        if name not in self.entries:
            raise ConfigError(f"{self.where}: tensor '{name}' is missing")
        file, start, entry = self.entries[name]
        if entry["shape"] != list(shape):
            raise ConfigError(f"{file}: tensor '{name}' has shape {entry['shape']}; "
                              f"config.json needs {list(shape)}")  # fmt: skip
        if self.framework == "pt":
            from safetensors import safe_open

            with safe_open(file, "pt") as f:
                tensor = f.get_tensor(name)
        else:
            import numpy as np

            dtype = _numpy_dtype(entry["dtype"])
            offset = start + entry["data_offsets"][0]
            tensor = np.fromfile(file, dtype, math.prod(shape), offset=offset).reshape(shape)
        check_finite(file, name, tensor)
        self.progress.advance(tensor_bytes(entry))
        return tensor


def tensor_bytes(entry: dict[str, Any]) -> int:
    """The bytes of a safetensors header entry's tensor."""
    begin, end = entry["data_offsets"]
    return int(end - begin)


def check_finite(file: Path, name: str, tensor: Any) -> None:
    """A ConfigError naming `file`, tensor `name` and its first NaN or Inf, where it has one:
    weights read for an import are checked once, as they are read."""
    bad = first_nonfinite(tensor)
    if bad is not None:
        value = float(tensor.reshape(-1)[bad])
        raise ConfigError(
            f"{file}: tensor '{name}' holds {value} at element {bad} (of {list(tensor.shape)}): "
            "these weights are not finite numbers",
            hint="a damaged download, or a model saved after its training diverged",
        )


def first_nonfinite(tensor: Any) -> int | None:
    """The flat index of the first NaN or Inf of a torch tensor or numpy array, or None; checked
    FINITE_BLOCK elements at a time, so the check's temporary stays small."""
    isfinite: Callable[[Any], Any]
    if type(tensor).__module__.startswith("torch"):
        import torch

        isfinite = torch.isfinite
    else:
        import numpy as np

        isfinite = np.isfinite
    flat = tensor.reshape(-1)
    for start in range(0, flat.shape[0], FINITE_BLOCK):
        ok = isfinite(flat[start : start + FINITE_BLOCK])
        if not ok.all():
            return start + ok.tolist().index(False)
    return None


def _numpy_dtype(code: str) -> Any:
    import numpy as np

    if code == "BF16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype({"F64": np.float64, "F32": np.float32, "F16": np.float16}[code])


class SafetensorsWriter:
    """HF safetensors files laid out before any tensor exists, from the tensors' names, shapes
    and safetensors dtypes (in file order): `model.safetensors` (`stem` names it), or files of
    about `shard_bytes` (default SHARD_BYTES) each and HF's index. `write` then puts each
    tensor (torch or numpy, any order) in its place, so an exporter holds one tensor at a
    time (a long export shows its progress); `close` checks all came."""

    def __init__(
        self,
        out: Path,
        tensors: Mapping[str, tuple[list[int], str]],
        shard_bytes: int | None = None,
        stem: str = "model",
    ) -> None:
        shards: list[dict[str, tuple[list[int], str]]] = [{}]
        size = 0
        for name, (shape, dtype) in tensors.items():
            nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
            if shards[-1] and size + nbytes > (shard_bytes or SHARD_BYTES):
                shards, size = [*shards, {}], 0
            shards[-1][name] = (list(shape), dtype)
            size += nbytes
        files = [f"{stem}.safetensors"] if len(shards) == 1 else [
            f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
        ]  # fmt: skip
        self.places: dict[str, tuple[Path, int, int]] = {}  # name -> file, offset, bytes
        total = 0
        for file, shard in zip(files, shards, strict=True):
            header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
            end = 0
            for name, (shape, dtype) in shard.items():
                begin, end = end, end + math.prod(shape) * DTYPE_BYTES[dtype]
                header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
            raw = json.dumps(header, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)  # data 8-byte aligned, as safetensors writes it
            with (out / file).open("wb") as f:
                f.write(struct.pack("<Q", len(raw)) + raw)
                f.truncate(8 + len(raw) + end)
            for name in shard:
                begin, stop = header[name]["data_offsets"]
                self.places[name] = (out / file, 8 + len(raw) + begin, stop - begin)
            total += end
        self.progress = ProgressLine(total, "HF weights written")
        if len(files) > 1:
            weight_map = {n: f for f, shard in zip(files, shards, strict=True) for n in shard}
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            write_json(out / INDEX, index)

    def write(self, name: str, tensor: Any) -> None:
        """Tensor `name`'s bytes into its place (its shape and dtype as laid out)."""
        file, offset, nbytes = self.places.pop(name)
        data = _bytes(tensor)
        if data.nbytes != nbytes:
            raise ValueError(f"{name}: {data.nbytes} bytes, laid out for {nbytes}")
        with file.open("r+b") as f:
            f.seek(offset)
            f.write(data)
        self.progress.advance(nbytes)

    def close(self) -> None:
        if self.places:
            raise ValueError(f"tensors laid out but not written: {', '.join(self.places)}")


def _bytes(tensor: Any) -> Any:
    """A tensor's bytes as a flat numpy uint8 array (torch tensors and numpy arrays)."""
    import numpy as np

    if type(tensor).__module__.startswith("torch"):
        import torch

        return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    return np.ascontiguousarray(tensor).reshape(-1).view(np.uint8)
