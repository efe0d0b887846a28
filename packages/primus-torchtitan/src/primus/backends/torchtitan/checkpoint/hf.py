"""Hugging Face checkpoints into and out of TorchTitan's DCP format, through TorchTitan's own
state-dict adapters (`ModelSpec.state_dict_adapter`: names, and the q/k row permutation between
HF's half-rotation RoPE and llama3's interleaved complex RoPE).

Both stream: a few tensors in host memory at a time (peak RSS: the process plus the largest
tensors, read and cast; one per import writer thread). Import checks every HF tensor from the safetensors headers first, then
DCP writes the model's global (unsharded) tensors in the training dtype, each read from its file
only as it is written, into `hf_import` inside the run's checkpoint folder; DCP reshards on
load, so any parallelism can start from it. Export reads a DCP step folder (or that import) one
tensor at a time into safetensors shards written tensor by tensor, without a process group and
without building the model.
"""

from __future__ import annotations

import copy
import math
import os
import re
from pathlib import Path
from typing import Any

from primus.core.checkpoint.hf import safetensors_files, safetensors_header
from primus.core.checkpoint.hf_tensors import (
    FLOAT_DTYPES,
    SafetensorsWriter,
    check_finite,
    tensor_bytes,
)
from primus.core.errors import ConfigError
from primus.core.progress import ProgressLine
from primus.core.reliability.atomic import write_json

IMPORT_FOLDER = "hf_import"  # beside the step-N folders; TorchTitan neither loads nor purges it
WRITER_THREADS = min(4, os.cpu_count() or 1)  # import: 1B on 2 cores, 40 s -> 29 s with 2
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
EMBEDDING, LM_HEAD = "tok_embeddings.weight", "lm_head.weight"
HF_LM_HEAD = "lm_head.weight"
Sources = dict[str, tuple[Path, str, str]]  # native key -> (file, HF tensor, converted key)
HF_MODEL_TYPES = {"llama3": ("llama", "LlamaForCausalLM"), "qwen3": ("qwen3", "Qwen3ForCausalLM")}


def import_dir(config: Any) -> Path:
    """Where `import_hf` writes for the run of this Trainer.Config."""
    return Path(config.dump_folder, config.checkpoint.folder, IMPORT_FOLDER)


def _family(config: Any) -> str:
    name = config.model_spec.name
    if name not in HF_MODEL_TYPES or config.model_spec.state_dict_adapter is None:
        raise ConfigError(f"TorchTitan's {name} model has no Hugging Face conversion here",
                          hint=f"supported: {', '.join(HF_MODEL_TYPES)}")  # fmt: skip
    return str(name)


def _adapter(config: Any) -> Any:
    """The family's state-dict adapter, untied: tied embeddings are handled here, tensor by
    tensor (the adapters tie by looking at the whole state dict at once)."""
    model = copy.copy(config.model_spec.model)
    model.enable_weight_tying = False
    return config.model_spec.state_dict_adapter(model, None)


def _tied(config: Any) -> bool:
    return bool(config.model_spec.model.enable_weight_tying)


def expected_state(config: Any) -> dict[str, Any]:
    """The model's state dict as meta tensors, in the training dtype (as the Trainer builds it)."""
    import torch

    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools.utils import set_default_dtype

    with torch.device("meta"), set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        model = config.model_spec.model.build()
    return dict(model.state_dict())


def base_state(config: Any) -> dict[str, Any]:
    """`expected_state` without LoRA adapters: what an HF model holds."""
    from primus.backends.torchtitan.posttrain.lora import is_adapter

    return {k: v for k, v in expected_state(config).items() if not is_adapter(k)}


def _hf_name(adapter: Any, key: str, tensor: Any) -> str:
    return next(iter(adapter.to_hf({key: tensor})), key)


# -- import ---------------------------------------------------------------------------------


def _convert(adapter: Any, name: str, tensor: Any, where: str) -> dict[str, Any]:
    try:
        return dict(adapter.from_hf({name: tensor}))
    except KeyError:
        raise ConfigError(f"{where}: has no place in the TorchTitan model") from None
    except RuntimeError as exc:  # a reshape of the q/k permutation that does not fit
        raise ConfigError(f"{where}: shape {list(tensor.shape)} does not fit: {exc}") from None


def _check(expected: dict[str, Any], key: str, value: Any, where: str) -> None:
    """A ConfigError naming the HF tensor when native `key` has no place or another shape."""
    if key not in expected:
        raise ConfigError(f"{where}: has no place in the TorchTitan model (it would be '{key}')")
    want = expected[key]
    if value.shape != want.shape:
        raise ConfigError(
            f"{where}: shape {list(value.shape)}, TorchTitan's '{key}' is {list(want.shape)}"
        )


def _check_norm_eps(hf_dir: Path, config: Any) -> None:
    from primus.core.checkpoint.hf import HFArchitecture, read_config

    hf_eps = HFArchitecture.from_config(read_config(hf_dir)).norm_eps
    eps = config.model_spec.model.norm.eps
    if not math.isclose(hf_eps, eps, rel_tol=1e-6):
        raise ConfigError(f"{hf_dir}/config.json: rms_norm_eps {hf_eps:g} differs from TorchTitan's "
                          f"{config.model_spec.name} ({eps:g}), which fixes it")  # fmt: skip


def _sources(hf_dir: Path, adapter: Any, expected: dict[str, Any], tied: bool) -> Sources:
    """Where each native tensor comes from: (file, HF tensor, the native key its conversion
    gives), checked from the safetensors headers alone (names, dtypes, shapes)."""
    import torch

    sources: Sources = {}
    files = safetensors_files(hf_dir)
    for path in files:
        for name, entry in safetensors_header(path).items():  # a truncation names its tensor
            if tied and name == HF_LM_HEAD:
                continue  # the embedding stands for it
            where = f"{path}: tensor '{name}'"
            if entry["dtype"] not in FLOAT_DTYPES:
                raise ConfigError(f"{where}: dtype {entry['dtype']} is not a floating-point dtype")
            shape = torch.empty(entry["shape"], device="meta")
            for key, value in _convert(adapter, name, shape, where).items():
                _check(expected, key, value, where)
                sources[key] = (path, name, key)
    if tied and EMBEDDING in sources:
        sources[LM_HEAD] = sources[EMBEDDING]
    missing = [_hf_name(adapter, key, expected[key]) for key in expected if key not in sources]
    if missing:
        names = ", ".join(p.name for p in files)
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"{hf_dir}: tensor '{missing[0]}'{more} is in none of {names}")
    return sources


def _streaming_planner(sources: Sources, adapter: Any, expected: dict[str, Any]) -> Any:
    """DCP's default save planner, planning from meta tensors and reading each tensor from its
    safetensors file (converted, cast to the training dtype) only as DCP writes it, its
    progress shown where the import takes long. A tensor holding NaN or Inf is kept as
    `refused` (raised within DCP's writer, the error would come wrapped and logged with DCP's
    traceback)."""
    from safetensors import safe_open
    from torch.distributed.checkpoint import DefaultSavePlanner

    headers = {path: safetensors_header(path) for path in {path for path, _, _ in sources.values()}}
    sizes = {fqn: tensor_bytes(headers[path][name]) for fqn, (path, name, _) in sources.items()}
    progress = ProgressLine(sum(sizes.values()), "HF weights read")

    class Planner(DefaultSavePlanner):  # type: ignore[misc]
        refused: ConfigError | None = None

        def lookup_object(self, index: Any) -> Any:
            path, name, key = sources[index.fqn]
            with safe_open(str(path), framework="pt") as f:
                tensor = f.get_tensor(name)
            try:
                check_finite(path, name, tensor)
            except ConfigError as exc:
                self.refused = self.refused or exc
            progress.advance(sizes[index.fqn])
            return adapter.from_hf({name: tensor})[key].to(expected[index.fqn].dtype)

    return Planner()


def import_hf(hf_dir: Path, config: Any, out: Path) -> None:
    """The HF model in `hf_dir` as a DCP checkpoint (model weights only) in `out`, one file per
    tensor: DCP's writer keeps every tensor of a file until the file is done, so each writer
    thread holds one tensor at a time."""
    import torch.distributed.checkpoint as dcp

    _family(config)
    _check_norm_eps(hf_dir, config)
    expected, adapter = base_state(config), _adapter(config)
    sources = _sources(hf_dir, adapter, expected, _tied(config))
    planner = _streaming_planner(sources, adapter, expected)
    dcp.save(
        expected,
        storage_writer=dcp.FileSystemWriter(
            str(out), single_file_per_rank=False, thread_count=WRITER_THREADS
        ),
        planner=planner,
        no_dist=True,
    )
    if planner.refused is not None:  # `out` is removed with the failed import
        raise planner.refused


# -- export ---------------------------------------------------------------------------------
def _step_folders(config: Any) -> dict[int, Path]:
    """Step -> DCP folder of the run: its `step-N` folders, and the import as step 0."""
    from primus.core.checkpoint.dcp import numbered

    root = Path(config.dump_folder, config.checkpoint.folder)
    folders = {n: p for n, p in numbered(root, "step-").items() if (p / ".metadata").is_file()}
    if (import_dir(config) / ".metadata").is_file():
        folders.setdefault(0, import_dir(config))
    return folders


def _source(config: Any, iteration: int | None) -> Path:
    folders = _step_folders(config)
    root = Path(config.dump_folder, config.checkpoint.folder)
    if not folders:
        raise ConfigError(f"{root}: no TorchTitan checkpoint (step-N folder or {IMPORT_FOLDER})",
                          hint="train with checkpoint.enable=true first")  # fmt: skip
    step = max(folders) if iteration is None else iteration
    if step not in folders:
        raise ConfigError(f"{root}: no checkpoint of step {step}",
                          hint=f"saved steps: {', '.join(map(str, sorted(folders)))}")  # fmt: skip
    return folders[step]


def hf_config(config: Any, dtype: str) -> dict[str, Any]:
    """config.json for the model of this Trainer.Config."""
    family = _family(config)
    model = config.model_spec.model
    layer = model.layers[0]
    attention, rope = layer.attention, layer.attention.rope
    n_heads = attention.n_heads
    model_type, architecture = HF_MODEL_TYPES[family]
    hf: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": model.dim,
        "intermediate_size": layer.feed_forward.w1.out_features,
        "num_hidden_layers": len(model.layers),
        "num_attention_heads": n_heads,
        "num_key_value_heads": attention.n_kv_heads or n_heads,
        "head_dim": attention.qkv_linear.head_dim or model.dim // n_heads,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": rope.max_seq_len,
        "rope_theta": float(rope.theta),
        "rms_norm_eps": model.norm.eps,
        "tie_word_embeddings": bool(model.enable_weight_tying),
        "hidden_act": "silu",
        "attention_bias": False,
        "dtype": dtype,
    }
    if family == "llama3":
        hf["mlp_bias"] = False
        if rope.scaling == "llama":
            hf["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": float(rope.scaling_factor),
                "low_freq_factor": float(rope.low_freq_factor),
                "high_freq_factor": float(rope.high_freq_factor),
                "original_max_position_embeddings": int(rope.original_max_position_embeddings),
            }
    else:
        hf.update(use_sliding_window=False, sliding_window=None)
    return hf


def export_hf(config: Any, iteration: int | None, out: Path, dtype_name: str | None) -> Path:
    """The run's DCP checkpoint (latest, or step `iteration`; 0: the import) as safetensors
    shards, their index and config.json in `out`, in `dtype_name` (None: `training.dtype`, the
    checkpoint's); the folder read. Tensors are read from DCP and written one at a time. A LoRA
    run's checkpoint holds the adapters: the frozen weights come from the import, each adapter
    merged into its weight."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from primus.backends.torchtitan.posttrain import lora
    from torchtitan.config import TORCH_DTYPE_MAP

    source = _source(config, iteration)
    adapted = lora.adapted_linears(config)
    base = import_dir(config) if adapted else source
    reader = dcp.FileSystemReader(str(base))
    stored = reader.read_metadata().state_dict_metadata
    dtype_name = dtype_name or config.training.dtype
    adapter, dtype = _adapter(config), TORCH_DTYPE_MAP[dtype_name]
    keys = [k for k in base_state(config) if not (_tied(config) and k == LM_HEAD)]
    for key in keys:
        if not isinstance(stored.get(key), TensorStorageMetadata):
            raise ConfigError(f"{base}: no tensor '{key}' (a checkpoint of another model?)")
    shapes = {k: list(stored[k].size) for k in keys}  # type: ignore[union-attr]
    names = {_hf_name(adapter, k, torch.empty(shapes[k], device="meta")): k for k in keys}
    updates = lora.updates(config, _adapters(source, config)) if adapted else {}

    def load(name: str) -> Any:  # DCP casts the stored tensor to `dtype` as it copies it in
        key = names[name]
        state = {key: torch.empty(shapes[key], dtype=torch.float64 if key in updates else dtype)}
        dcp.load(state, storage_reader=reader, no_dist=True)
        if key in updates:
            state[key] = (state[key] + updates[key]()).to(dtype)
        return adapter.to_hf(state)[name]

    code = SAFETENSORS_DTYPES[dtype_name]
    writer = SafetensorsWriter(out, {name: (shapes[key], code) for name, key in names.items()})
    for name in names:
        writer.write(name, load(name))
    writer.close()
    hf_dtype = str(dtype).removeprefix("torch.")
    write_json(out / "config.json", hf_config(config, hf_dtype))
    return source


def _hf_rows(adapter: Any, key: str, shape: Any, orders: dict[Any, Any]) -> tuple[str, Any]:
    """The HF name of native weight `key` (of `shape`), and the native row of each HF row
    (the q/k row permutation of RoPE; the identity elsewhere). The order is the same in every
    layer: it is found once per projection and kept in `orders`."""
    import torch

    name = _hf_name(adapter, key, torch.empty(shape, device="meta"))
    kind = (re.sub(r"\.\d+\.", ".", key), tuple(shape))
    if kind not in orders:
        out, width = shape
        rows = torch.arange(out, dtype=torch.float64)[:, None].expand(out, width).contiguous()
        orders[kind] = next(iter(adapter.to_hf({key: rows}).values()))[:, 0].long()
    return name, orders[kind]


def lora_adapters(config: Any, iteration: int | None) -> dict[str, Any]:
    """The LoRA adapters of the run's checkpoint (latest, or step `iteration`) as (A, B) per
    HF module: B's rows in the HF weight's order (its q/k row permutation included)."""
    from primus.backends.torchtitan.posttrain import lora

    adapter, shapes, found = _adapter(config), base_state(config), {}
    orders: dict[Any, Any] = {}
    adapters = _adapters(_source(config, iteration), config)
    for key, (a, b, _) in lora.factors(config, adapters).items():
        name, order = _hf_rows(adapter, key, shapes[key].shape, orders)
        found[name.removesuffix(".weight")] = (a, b[order])
    return found


def adapters_from_peft(config: Any, folder: Path) -> dict[str, Any]:
    """The adapter parameters of the model, whole, from the PEFT adapter in `folder`
    (`init_from.adapter`): the inverse of `lora_adapters`."""
    import torch

    from primus.backends.torchtitan.posttrain import lora
    from primus.core.checkpoint.peft_adapter import read_adapter

    adapter, shapes, factors = _adapter(config), base_state(config), read_adapter(folder)
    orders: dict[Any, Any] = {}

    def factor(key: str) -> tuple[Any, Any]:
        name, order = _hf_rows(adapter, key, shapes[key].shape, orders)
        module = name.removesuffix(".weight")
        if module not in factors:
            raise ConfigError(f"init_from.adapter: {folder} has no adapter for {module}")
        a, b = factors[module]
        if b.shape[0] != len(order) or a.shape[1] != shapes[key].shape[1]:
            raise ConfigError(f"init_from.adapter: {module}'s factors are {list(b.shape)} x "
                              f"{list(a.shape)}, this model's weight {list(shapes[key].shape)}")  # fmt: skip
        native = torch.empty_like(b)
        native[order] = b
        return a, native

    return lora.native_adapters(config, factor)


def _adapters(source: Path, config: Any) -> dict[str, Any]:
    """The LoRA adapters of a step folder, as stored (a step-N checkpoint of a LoRA run)."""
    import torch
    import torch.distributed.checkpoint as dcp

    from primus.backends.torchtitan.posttrain import lora

    if source == import_dir(config):
        raise ConfigError(f"{source}: the HF import holds no LoRA adapters",
                          hint="export a step-N checkpoint of the LoRA run")  # fmt: skip
    state = {k: v for k, v in expected_state(config).items() if lora.is_adapter(k)}
    state = {k: torch.empty(v.shape, dtype=torch.float32) for k, v in state.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(source)), no_dist=True)
    return state


def tokenizer_dir(config: Any) -> Path | None:
    """The experiment's tokenizer folder (`hf_assets_path`), None when it trains on mock data."""
    from primus.backends.torchtitan.data.datasets import MockTokenizer

    if isinstance(config.tokenizer, MockTokenizer.Config):
        return None
    folder = Path(config.hf_assets_path)
    return folder if folder.is_dir() else None


def start_from_import(config: Any) -> Path | None:
    """Make TorchTitan's checkpointer load the imported weights (model only) when the run has
    no checkpoint of its own: `checkpoint.initial_load_path` is the import folder (TorchTitan
    prefers any step-N folder over it). A run with checkpointing off only loads (`load_only`)."""
    folder = import_dir(config)
    if not (folder / ".metadata").is_file():
        return None
    checkpoint, folder = config.checkpoint, folder.resolve()
    if checkpoint.initial_load_in_hf or checkpoint.initial_load_path not in (None, str(folder)):
        raise ConfigError(
            f"{folder} holds imported HF weights, and checkpoint.initial_load_path/"
            "initial_load_in_hf name another start",
            hint=f"remove {folder}, or the checkpoint.initial_load_* settings",
        )
    checkpoint.initial_load_path = str(folder)
    checkpoint.initial_load_model_only = True
    if not checkpoint.enable:
        checkpoint.enable = checkpoint.load_only = True
    return folder
