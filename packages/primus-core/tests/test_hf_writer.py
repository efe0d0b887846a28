"""SafetensorsWriter: each group of tensors one file; the files named and indexed at the end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from primus.core.checkpoint.hf import safetensors_files
from primus.core.checkpoint.hf_writer import INDEX, SafetensorsWriter


def test_groups_become_numbered_files_and_an_index_with_every_tensor(tmp_path: Path) -> None:
    groups = [{"a": np.arange(6, dtype=np.float32).reshape(2, 3)},
              {"b": np.ones(4, dtype=np.float16), "c": np.zeros((1,), dtype=np.float32)},
              {}, {"d": np.full((2, 2), 7.0, dtype=np.float32)}]  # fmt: skip
    writer = SafetensorsWriter(tmp_path)
    for group in groups:
        writer.write(group)
    writer.finish()
    index = json.loads((tmp_path / INDEX).read_text())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [INDEX] + [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    )
    assert index["weight_map"] == {"a": "model-00001-of-00003.safetensors",
                                   "b": "model-00002-of-00003.safetensors",
                                   "c": "model-00002-of-00003.safetensors",
                                   "d": "model-00003-of-00003.safetensors"}  # fmt: skip
    assert index["metadata"]["total_size"] == 24 + 8 + 4 + 16
    read = {k: v for path in safetensors_files(tmp_path) for k, v in load_file(path).items()}
    for group in groups:
        for name, array in group.items():
            assert read[name].dtype == array.dtype and np.array_equal(read[name], array)


def test_one_group_is_one_unindexed_file(tmp_path: Path) -> None:
    writer = SafetensorsWriter(tmp_path)
    writer.write({"w": np.eye(3, dtype=np.float32)})
    writer.finish()
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    assert np.array_equal(load_file(tmp_path / "model.safetensors")["w"], np.eye(3))
