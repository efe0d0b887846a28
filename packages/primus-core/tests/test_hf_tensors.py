"""HFTensors reads and checks one tensor at a time; SafetensorsWriter lays the files out up
front and takes tensors one at a time, in any order."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from primus.core.checkpoint.hf import safetensors_files
from primus.core.checkpoint.hf_tensors import INDEX, HFTensors, SafetensorsWriter
from primus.core.errors import ConfigError


def test_tensors_written_in_any_order_land_in_indexed_shards(tmp_path: Path) -> None:
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3),  # 24 bytes
               "b": np.ones(4, dtype=np.float16), "c": np.zeros((1,), dtype=np.float32),  # 12
               "d": np.full((2, 2), 7.0, dtype=np.float32)}  # 16  # fmt: skip
    codes = {np.float32: "F32", np.float16: "F16"}
    layout = {n: (list(t.shape), codes[t.dtype.type]) for n, t in tensors.items()}
    writer = SafetensorsWriter(tmp_path, layout, shard_bytes=36)
    for name in ("d", "b", "a", "c"):
        writer.write(name, tensors[name])
    writer.close()
    index = json.loads((tmp_path / INDEX).read_text())
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([INDEX, first, second])
    assert index["weight_map"] == {"a": first, "b": first, "c": first, "d": second}
    assert index["metadata"]["total_size"] == 24 + 12 + 16
    read = {k: v for path in safetensors_files(tmp_path) for k, v in load_file(path).items()}
    for name, array in tensors.items():
        assert read[name].dtype == array.dtype and np.array_equal(read[name], array)


def test_bf16_torch_tensors_round_trip_through_one_file(tmp_path: Path) -> None:
    weight = torch.randn(3, 5).to(torch.bfloat16)
    writer = SafetensorsWriter(tmp_path, {"w": ([3, 5], "BF16")})
    writer.write("w", weight)
    writer.close()
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    assert torch.equal(HFTensors(tmp_path, "pt").get("w", (3, 5)), weight)
    read = HFTensors(tmp_path, "numpy").get("w", (3, 5))
    assert np.array_equal(read.astype(np.float32), weight.float().numpy())


def test_a_tensor_not_as_laid_out_or_never_written_is_an_error(tmp_path: Path) -> None:
    writer = SafetensorsWriter(tmp_path, {"w": ([2, 2], "F32"), "v": ([1], "F32")})
    with pytest.raises(ValueError, match="w: 8 bytes, laid out for 16"):
        writer.write("w", np.ones(2, np.float32))
    with pytest.raises(ValueError, match="laid out but not written: v"):
        writer.close()


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
    header = json.dumps({"w": {"dtype": "F32", "shape": "2x2", "data_offsets": [0, 16]}})
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    with pytest.raises(ConfigError, match=r"not a safetensors file \(tensor 'w': a malformed"):
        HFTensors(tmp_path, "numpy")
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 10_000) + b"{")
    with pytest.raises(ConfigError, match=r"model\.safetensors: truncated safetensors file"):
        HFTensors(tmp_path, "numpy")


def test_a_folder_named_safetensors_and_a_bad_index_are_config_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from primus.cli.main import main

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(SystemExit) as done:
        main(["checkpoint", "inspect", str(tmp_path)])
    err = capsys.readouterr().err
    assert done.value.code == 2 and "Traceback" not in err, err
    assert "model.safetensors: a folder, not a safetensors file" in err
    (tmp_path / "model.safetensors").rmdir()
    save_file({"w": np.ones((2, 2), np.float32)}, str(tmp_path / "model.safetensors"))
    for index in ("{garbage", "[]", '{"weight_map": ["model.safetensors"]}'):
        (tmp_path / "model.safetensors.index.json").write_text(index)
        with pytest.raises(ConfigError, match=r"index.json: not a safetensors index"):
            HFTensors(tmp_path, "numpy")


def test_stored_tensors_the_model_does_not_read_are_refused_up_front(tmp_path: Path) -> None:
    one = np.ones((2, 2), np.float32)
    save_file({"a": one, "b": one, "x.rotary_emb.inv_freq": one[0], "lm_head.weight": one},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    tensors = HFTensors(tmp_path, "numpy")
    tensors.check_unread(["a", "b"])  # RoPE's cache and a tied head's copy may stay unread
    with pytest.raises(ConfigError, match=r"tensor 'b' has no place in the model") as err:
        tensors.check_unread(["a"])
    assert "num_hidden_layers" in str(err.value.hint)


@pytest.mark.parametrize("framework", ["numpy", "pt"])
def test_a_tensor_with_nan_or_inf_is_refused_as_it_is_read(
    tmp_path: Path, framework: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from primus.core.checkpoint import hf_tensors

    monkeypatch.setattr(hf_tensors, "FINITE_BLOCK", 4)  # checked in blocks: found in any
    bad = np.ones((3, 3), np.float32)
    bad[2, 1] = np.inf
    save_file({"a": np.ones((3, 3), np.float16), "b": bad, "c": np.full(2, np.nan, np.float32)},
              str(tmp_path / "model.safetensors"))  # fmt: skip
    tensors = HFTensors(tmp_path, framework)
    assert tensors.get("a", (3, 3)).sum() == 9
    with pytest.raises(ConfigError, match=r"tensor 'b' holds inf at element 7 \(of \[3, 3\]\)"):
        tensors.get("b", (3, 3))
    with pytest.raises(ConfigError, match=r"tensor 'c' holds nan at element 0"):
        tensors.get("c", (2,))
    if framework == "pt":  # a PEFT adapter read back (init_from.adapter) is checked the same
        from primus.core.checkpoint.peft_adapter import read_adapter

        name = "base_model.model.layers.0.q_proj.lora_B.weight"
        save_file({name: bad}, str(tmp_path / "adapter_model.safetensors"))
        with pytest.raises(ConfigError, match=f"tensor '{name}' holds inf at element 7"):
            read_adapter(tmp_path)


def test_reads_and_writes_that_take_long_show_their_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line every LOG_EVERY_S (here each tensor) of what is done, MB/s and the share; the
    tensors the model does not read (`check_unread`) are not in the total."""
    from primus.core import progress

    monkeypatch.setattr(progress, "LOG_EVERY_S", 0.0)
    save_file({"a": np.ones(250, np.float32), "b": np.ones(250, np.float32),
               "x.rotary_emb.inv_freq": np.ones(500, np.float32)}, str(tmp_path / "model.safetensors"))  # fmt: skip
    tensors = HFTensors(tmp_path, "numpy")
    tensors.check_unread(["a", "b"])
    tensors.get("a", (250,))
    tensors.get("b", (250,))
    lines = capsys.readouterr().err.splitlines()
    assert (
        lines[0].startswith("HF weights read: 0.00 of 0.00 MB · ") and " · 50% · ETA " in lines[0]
    )
    assert lines[-1].endswith(" · 100%") and len(lines) == 2  # the last: the whole, once
    (tmp_path / "out").mkdir()
    writer = SafetensorsWriter(tmp_path / "out", {"a": ([250_000], "F32"), "b": ([250_000], "F32")})
    for name in ("a", "b"):
        writer.write(name, np.ones(250_000, np.float32))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" · ")[0] for line in lines] == [
        "HF weights written: 1.00 of 2.00 MB",
        "HF weights written: 2.00 of 2.00 MB",
    ]
