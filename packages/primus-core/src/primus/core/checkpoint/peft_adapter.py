"""A LoRA run's adapters as a PEFT adapter folder: `adapter_config.json` and
`adapter_model.safetensors`, which `peft.PeftModel.from_pretrained(base, folder)` loads onto
the HF base model, and which serving stacks (vLLM, TGI) load beside it.

A backend gives each adapted HF linear's factors in HF space: A (rank x in) and B (out x
rank), so that the linear's weight becomes W + (alpha / rank) B A, as PEFT computes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primus.core.checkpoint.hf_tensors import SafetensorsWriter
from primus.core.config.posttrain import PeftConfig
from primus.core.reliability.atomic import write_json

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_STEM = "adapter_model"  # adapter_model.safetensors
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
        out, {name: (list(t.shape), code) for name, t in tensors.items()}, stem=ADAPTER_STEM
    )
    for name, tensor in tensors.items():
        writer.write(name, tensor.to(torch_dtype))
    writer.close()
    write_json(out / ADAPTER_CONFIG, adapter_config(peft, factors, base))
