"""HFTensors reads and checks one tensor at a time; SafetensorsWriter writes shards, named and
indexed at the end."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from primus.core.checkpoint.hf import safetensors_files
from primus.core.checkpoint.hf_tensors import INDEX, HFTensors, SafetensorsWriter
from primus.core.errors import ConfigError


def test_tensors_are_written_in_shards_with_an_index_naming_every_tensor(tmp_path: Path) -> None:
    groups = [{"a": np.arange(6, dtype=np.float32).reshape(2, 3)},  # 24 bytes
              {"b": np.ones(4, dtype=np.float16), "c": np.zeros((1,), dtype=np.float32)},  # 12
              {"d": np.full((2, 2), 7.0, dtype=np.float32)}]  # 16  # fmt: skip
    writer = SafetensorsWriter(tmp_path, shard_bytes=36)
    for group in groups:
        writer.add(group)
    writer.finish()
    index = json.loads((tmp_path / INDEX).read_text())
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([INDEX, first, second])
    assert index["weight_map"] == {"a": first, "b": first, "c": first, "d": second}
    assert index["metadata"]["total_size"] == 24 + 12 + 16
    read = {k: v for path in safetensors_files(tmp_path) for k, v in load_file(path).items()}
    for group in groups:
        for name, array in group.items():
            assert read[name].dtype == array.dtype and np.array_equal(read[name], array)


def test_one_shard_is_one_unindexed_file(tmp_path: Path) -> None:
    writer = SafetensorsWriter(tmp_path)
    writer.add({"w": np.eye(3, dtype=np.float32)})
    writer.finish()
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    assert np.array_equal(HFTensors(tmp_path, "numpy").get("w", (3, 3)), np.eye(3))


def test_a_bad_tensor_is_named_with_its_file(tmp_path: Path) -> None:
    save_file({"w": np.ones((2, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    tensors = HFTensors(tmp_path, "numpy")
    with pytest.raises(ConfigError, match=r"model\.safetensors: tensor 'v' is missing"):
        tensors.get("v", (2, 2))
    with pytest.raises(
        ConfigError, match=r"tensor 'w' has shape \[2, 2\]; config.json needs \[4\]"
    ):
        tensors.get("w", (4,))
    save_file({"ids": np.ones(3, np.int64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"model\.safetensors: tensor 'ids' has dtype I64"):
        HFTensors(tmp_path, "numpy")
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 10_000) + b"{")
    with pytest.raises(ConfigError, match=r"model\.safetensors: truncated safetensors file"):
        HFTensors(tmp_path, "numpy")
