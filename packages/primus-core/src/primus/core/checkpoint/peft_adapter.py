"""A LoRA run's adapters as a PEFT adapter folder: `adapter_config.json` and
`adapter_model.safetensors`, which `peft.PeftModel.from_pretrained(base, folder)` loads onto
the HF base model, and which serving stacks (vLLM, TGI) load beside it; and such a folder
read back (`init_from.adapter`).

A backend gives each adapted HF linear's factors in HF space: A (rank x in) and B (out x
rank), so that the linear's weight becomes W + (alpha / rank) B A, as PEFT computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primus.core.checkpoint.hf import safetensors_header
from primus.core.checkpoint.hf_tensors import SafetensorsWriter, check_finite
from primus.core.config.init_from import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from primus.core.config.posttrain import PeftConfig
from primus.core.errors import ConfigError
from primus.core.reliability.atomic import write_json

CODES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}

Factors = Mapping[str, tuple[Any, Any]]  # HF module name -> (A, B), torch tensors


def adapter_config(peft: PeftConfig, factors: Factors, base: str | None) -> dict[str, Any]:
    """PEFT's LoraConfig for these adapters, as `save_pretrained` writes it."""
    targets = sorted({module.rsplit(".", 1)[-1] for module in factors})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": peft.rank,
        "lora_alpha": peft.alpha,
        "lora_dropout": peft.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }


def write_adapter(
    out: Path, factors: Factors, peft: PeftConfig, base: str | None, dtype: str
) -> None:
    """Write the PEFT adapter of `factors` into the folder `out`, tensors in `dtype`
    (float32, bfloat16 or float16)."""
    import torch

    tensors = {
        f"base_model.model.{module}.lora_{side}.weight": factor
        for module, pair in sorted(factors.items())
        for side, factor in zip("AB", pair, strict=True)
    }
    code, torch_dtype = CODES[dtype], getattr(torch, dtype)
    writer = SafetensorsWriter(
        out,
        {name: (list(t.shape), code) for name, t in tensors.items()},
        stem=ADAPTER_WEIGHTS.removesuffix(".safetensors"),
    )
    for name, tensor in tensors.items():
        writer.write(name, tensor.to(torch_dtype))
    writer.close()
    write_json(out / ADAPTER_CONFIG, adapter_config(peft, factors, base))


def read_adapter(folder: Path) -> dict[str, tuple[Any, Any]]:
    """The LoRA factors of the PEFT adapter in `folder`: HF module name -> (A, B), float32
    torch tensors; a ConfigError naming the file where a module lacks A or B, or a factor
    holds NaN or Inf."""
    import re

    from safetensors import safe_open

    path = folder / ADAPTER_WEIGHTS
    pattern = re.compile(r"base_model\.model\.(.+)\.lora_([AB])(?:\.[^.]+)?\.weight")
    found: dict[str, dict[str, Any]] = {}
    with safe_open(path, "pt") as f:
        for name in safetensors_header(path):
            match = pattern.fullmatch(name)
            if match is None:
                raise ConfigError(f"{path}: tensor '{name}' is not a LoRA factor",
                                  hint="Primus continues adapters of LoRA alone")  # fmt: skip
            tensor = f.get_tensor(name)
            check_finite(path, name, tensor)
            found.setdefault(match[1], {})[match[2]] = tensor.float()
    for module, pair in found.items():
        if set(pair) != {"A", "B"}:
            raise ConfigError(f"{path}: {module} has lora_{''.join(pair)} alone")
    return {module: (pair["A"], pair["B"]) for module, pair in found.items()}
