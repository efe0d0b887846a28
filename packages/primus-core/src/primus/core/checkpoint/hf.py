"""Hugging Face model directories, read as plain files: config.json (JSON) and the headers of
*.safetensors (an 8-byte little-endian length, then JSON). No tensor is loaded."""

from __future__ import annotations

import json
import math
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError, json_type

# HF model_type -> the family name Primus uses for it.
FAMILIES = {"llama": "llama3", "qwen2": "qwen2.5", "qwen3": "qwen3", "mixtral": "mixtral"}
# Llama-3 RoPE scaling parameters as HF names them.
LLAMA3_SCALING = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
INDEX = "model.safetensors.index.json"  # which safetensors file holds each tensor
# safetensors dtype -> bytes per element
DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2,
               "I16": 2, "U16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1}  # fmt: skip
# safetensors float dtype -> its name in config.json (and in the backends' dtype options)
DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def read_config(folder: Path) -> dict[str, Any]:
    """The parsed config.json of an HF model directory (ConfigError if missing or not JSON)."""
    path = folder / "config.json"
    if folder.is_file():
        raise ConfigError(f"{folder}: a file, not a Hugging Face model directory",
                          hint="name the folder that holds config.json")  # fmt: skip
    if not path.is_file():
        raise ConfigError(f"{folder}: no config.json (not a Hugging Face model directory)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: byte {exc.start}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return config


@dataclass(frozen=True)
class HFArchitecture:
    """The architecture numbers of an HF causal LM config, checked for what Primus supports.

    `rope_scaling` holds the Llama-3 scaling parameters (LLAMA3_SCALING), or is None.
    MoE fields are None for dense models.
    """

    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tie_embeddings: bool
    norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, float] | None
    max_position_embeddings: int
    qkv_bias: bool
    qk_norm: bool
    num_experts: int | None = None
    experts_per_token: int | None = None
    router_aux_loss_coef: float | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> HFArchitecture:
        """Parse config.json's dict; a ConfigError names the field Primus cannot map."""
        model_type = _field(config, "model_type")
        if not isinstance(model_type, str):
            raise _wrong_type(
                "model_type", "a string", model_type, f"supported: {', '.join(FAMILIES)}"
            )
        if model_type not in FAMILIES:
            raise ConfigError(
                f"config.json: model_type '{model_type}' is not supported",
                hint=f"supported: {', '.join(FAMILIES)}",
            )
        _refuse(config, "hidden_act", lambda v: v != "silu", "only SiLU (SwiGLU) MLPs")
        _refuse(config, "mlp_bias", bool, "MLP biases")
        if model_type != "qwen2":  # Qwen2's QKV bias is built in; elsewhere it is an option
            _refuse(config, "attention_bias", bool, "attention biases")
        _refuse(config, "use_sliding_window", bool, "sliding-window attention")
        if model_type != "qwen2":  # Qwen2 keeps a sliding_window value it does not use
            _refuse(config, "sliding_window", lambda v: v is not None, "sliding-window attention")
        heads = _int(config, "num_attention_heads")
        hidden = _int(config, "hidden_size")
        kv_heads = _int(config, "num_key_value_heads", heads)
        if heads % kv_heads:
            raise ConfigError(f"config.json: 'num_key_value_heads: {kv_heads}' does not divide "
                              f"'num_attention_heads: {heads}'")  # fmt: skip
        moe = model_type == "mixtral"
        return cls(
            family=FAMILIES[model_type],
            hidden_size=hidden,
            num_layers=_int(config, "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=_int(config, "head_dim", hidden // heads),
            ffn_hidden_size=_int(config, "intermediate_size"),
            vocab_size=_int(config, "vocab_size"),
            tie_embeddings=_bool(config, "tie_word_embeddings"),
            norm_eps=_positive("rms_norm_eps", _field(config, "rms_norm_eps")),
            rope_theta=_positive(
                "rope_theta", _rope(config).get("rope_theta") or _field(config, "rope_theta")
            ),
            rope_scaling=_llama3_scaling(config),
            max_position_embeddings=_int(config, "max_position_embeddings"),
            qkv_bias=model_type == "qwen2",
            qk_norm=model_type == "qwen3",
            num_experts=_int(config, "num_local_experts") if moe else None,
            experts_per_token=_int(config, "num_experts_per_tok") if moe else None,
            router_aux_loss_coef=(
                _positive("router_aux_loss_coef", _field(config, "router_aux_loss_coef"), zero=True)
                if moe
                else None
            ),
        )


def _field(config: dict[str, Any], name: str) -> Any:
    if config.get(name) is None:
        raise ConfigError(f"config.json: '{name}' is missing")
    return config[name]


def _int(config: dict[str, Any], name: str, default: int | None = None) -> int:
    """The positive integer `name` (a size or a count), or `default` where it is absent."""
    value = config.get(name)
    if value is None:
        value = _field(config, name) if default is None else default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"config.json: '{name}' must be a positive integer, not {value!r}")
    return value


def _wrong_type(name: str, wanted: str, value: Any, hint: str | None = None) -> ConfigError:
    """The error of config.json's field `name` holding a JSON value of another type."""
    got = json_type(value)
    article = "an" if got[0] in "aeiou" else "a"
    return ConfigError(f"config.json: '{name}' must be {wanted}, not {article} {got} "
                       f"({json.dumps(value)})", hint=hint)  # fmt: skip


def _bool(config: dict[str, Any], name: str) -> bool:
    """The boolean `name`, false where it is absent (or null)."""
    value = config.get(name)
    if value is not None and not isinstance(value, bool):
        raise _wrong_type(name, "true or false", value)
    return bool(value)


def _positive(name: str, value: Any, zero: bool = False) -> float:
    """The finite number `value` of the field `name`, above 0 (or 0 with `zero`)."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        least = "0 or more" if zero else "above 0"
        raise ConfigError(f"config.json: '{name}' must be a finite number {least}, not {value!r}")
    return float(value)


def _refuse(config: dict[str, Any], name: str, bad: Any, what: str) -> None:
    if name in config and bad(config[name]):
        raise ConfigError(
            f"config.json: '{name}: {json.dumps(config[name])}' is not supported ({what})"
        )


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE parameters: transformers 5's `rope_parameters`, or the older `rope_scaling`."""
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key)
        if rope is not None and not isinstance(rope, dict):
            raise _wrong_type(key, "an object", rope)
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _llama3_scaling(config: dict[str, Any]) -> dict[str, float] | None:
    rope = _rope(config)
    key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise ConfigError(
            f"config.json: '{key}.rope_type: {kind}' is not supported (default and llama3 are)"
        )
    missing = [name for name in LLAMA3_SCALING if name not in rope]
    if missing:
        raise ConfigError(f"config.json: '{key}.{missing[0]}' is missing (llama3 RoPE scaling)")
    return {name: _positive(f"{key}.{name}", rope[name]) for name in LLAMA3_SCALING}


def check_fixed_scaling(arch: HFArchitecture, fixed: dict[str, float], backend: str) -> None:
    """A ConfigError naming the first Llama-3 scaling parameter that differs from the value
    `backend` hard-codes (`fixed`: some of LLAMA3_SCALING)."""
    for name, value in fixed.items():
        got = (arch.rope_scaling or {}).get(name)
        if got is not None and got != value:
            raise ConfigError(
                f"config.json: rope scaling '{name}: {got:g}' cannot be expressed on {backend} "
                f"(its Llama-3 RoPE scaling fixes {name} at {value:g})"
            )


def safetensors_summary(folder: Path) -> dict[str, Any]:
    """Tensor count, parameters, dtypes and bytes of every *.safetensors file in `folder`,
    from their headers alone."""
    files = sorted(folder.glob("*.safetensors"))
    dtypes: Counter[str] = Counter()
    tensors = parameters = data_bytes = 0
    for path in files:
        for entry in safetensors_header(path).values():
            dtypes[entry["dtype"]] += 1
            tensors += 1
            parameters += math.prod(entry["shape"])
            data_bytes += entry["data_offsets"][1] - entry["data_offsets"][0]
    return {
        "files": len(files),
        "tensors": tensors,
        "parameters": parameters,
        "dtypes": dict(sorted(dtypes.items())),
        "bytes": sum(p.stat().st_size for p in files),
        "tensor_bytes": data_bytes,
    }


def weights_dtype(folder: Path) -> str | None:
    """The dtype (DTYPE_NAMES) holding most of the parameters of the HF model in `folder`, from
    its safetensors headers; None when it has no floating-point tensor."""
    counts: Counter[str] = Counter()
    for path in safetensors_files(folder):
        for entry in safetensors_header(path).values():
            if entry["dtype"] in DTYPE_NAMES:
                counts[DTYPE_NAMES[entry["dtype"]]] += math.prod(entry["shape"])
    return counts.most_common(1)[0][0] if counts else None


def safetensors_header(path: Path) -> dict[str, Any]:
    """The tensor entries of a safetensors file's header (`__metadata__` left out); a
    ConfigError when the header is malformed or truncated, or naming the first tensor whose
    data lies past the end of a truncated file."""
    if not path.is_file():
        what = "a folder" if path.is_dir() else "missing, or a broken link"
        raise ConfigError(f"{path}: {what}, not a safetensors file",
                          hint="the HF model folder holds its weights as *.safetensors files")  # fmt: skip
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        length = struct.unpack("<Q", raw)[0] if len(raw) == 8 else size
        if 8 + length > size:
            raise ConfigError(f"{path}: truncated safetensors file (header past the end)")
        try:
            header = json.loads(f.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = None
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: not a safetensors file (bad JSON header)")
    header.pop("__metadata__", None)
    bad = next((name for name, entry in header.items() if not _tensor_entry(entry)), None)
    if bad is not None:
        raise ConfigError(f"{path}: not a safetensors file (tensor '{bad}': a malformed entry)")
    ends = sorted((8 + length + e["data_offsets"][1], name) for name, e in header.items())
    cut = next(((end, name) for end, name in ends if end > size), None)
    if cut is not None:
        raise ConfigError(f"{path}: truncated safetensors file: tensor '{cut[1]}' ends at byte "
                          f"{cut[0]}, the file at {size}")  # fmt: skip
    return header


def _tensor_entry(entry: Any) -> bool:
    """`entry` is a safetensors header's tensor: a dtype name, a shape of sizes, and the start
    and end of its data."""
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return False
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
        return False
    return all(type(n) is int and n >= 0 for n in [*shape, *offsets]) and offsets[0] <= offsets[1]


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors files of an HF model directory: those its index names, else every
    *.safetensors; a ConfigError when there are none or an indexed one is missing."""
    index = folder / INDEX
    if index.is_file():
        files = [folder / name for name in _indexed_files(index)]
        for path in files:
            if not path.is_file():
                raise ConfigError(f"{path}: missing (named by {index.name})")
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{folder}: no *.safetensors files")
    return files


def _indexed_files(index: Path) -> list[str]:
    """The file names the weight map of `index` names; a ConfigError when it has none."""
    try:
        weights = json.loads(index.read_text()).get("weight_map")
    except (ValueError, AttributeError):
        weights = None
    if not isinstance(weights, dict) or not all(isinstance(n, str) for n in weights.values()):
        raise ConfigError(f"{index}: not a safetensors index (no weight_map of tensor -> file)",
                          hint="remove it where the model is one model.safetensors")  # fmt: skip
    return sorted(set(weights.values()))


def is_hf_directory(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def inspect_hf_directory(folder: Path) -> dict[str, Any]:
    """What an HF model directory holds: its architecture and its tensors."""
    config = read_config(folder)
    shape = {
        key: config.get(key)
        for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "intermediate_size", "vocab_size",
                    "tie_word_embeddings", "num_local_experts", "torch_dtype", "dtype")
        if config.get(key) is not None
    }  # fmt: skip
    return {
        "format": "huggingface",
        "backend": None,
        "iteration": None,
        "model": {"architectures": config.get("architectures"), **shape},
        "size": safetensors_summary(folder),
        "tokenizer": (folder / "tokenizer.json").is_file()
        or (folder / "tokenizer.model").is_file(),
    }
