"""`primus checkpoint tiny`: a tiny random-initialised Llama-3 HF model (2 layers, hidden 64),
the model of the CPU fine-tuning recipes (each backend's `tiny_llama3` preset), so a recipe
runs without downloading one. Needs torch and transformers (imported on call)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError
from primus.core.reliability.atomic import check_replaceable, staged_folder

# Llama 3.2's RoPE scaling (rope_scaling of meta-llama/Llama-3.2-1B's config.json).
LLAMA3_2_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "factor": 32.0, "original_max_position_embeddings": 8192}  # fmt: skip
TINY_LLAMA3: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 16384,
    "rope_theta": 500000.0, "rope_scaling": LLAMA3_2_ROPE, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}  # fmt: skip
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def random_hf_model(folder: Path, values: Mapping[str, Any], seed: int = 0) -> Path:
    """Save a random HF model of the config.json `values` (with its model_type) in `folder` as
    fp32 safetensors; the folder. Weights are drawn with std 0.5 for vectors and
    1/sqrt(fan-in) for matrices (norm weights around 1), so every tensor matters to the logits."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.utils import logging
    except ImportError as exc:
        raise ConfigError(
            f"making an HF model needs torch and transformers ({exc.name} is missing)",
            hint="pip install torch transformers",
        ) from None
    logging.disable_progress_bar()  # "Writing model shards" for one small file
    values = dict(values)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.5 if param.dim() == 1 else param.shape[-1] ** -0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def write_tiny_model(
    folder: Path, tokenizer: Path | None = None, seed: int = 0, force: bool = False
) -> Path:
    """Save the tiny Llama-3 (TINY_LLAMA3, random weights drawn from `seed`) in `folder`, with
    the HF tokenizer of the folder `tokenizer` when given; the folder. A non-empty `folder` is
    replaced only with `force`, and only once the new model is whole."""
    if tokenizer is not None and tokenizer.name == "tokenizer.json" and tokenizer.is_file():
        tokenizer = tokenizer.parent  # the file named: its folder holds the rest
    if tokenizer is not None and not tokenizer.exists():
        raise ConfigError(f"--tokenizer {tokenizer}: not found")
    if tokenizer is not None and not (tokenizer / "tokenizer.json").is_file():
        raise ConfigError(f"{tokenizer}: no tokenizer.json (an HF tokenizer folder is needed)")
    check_replaceable(folder, force)
    with staged_folder(folder, replace=force) as staging:  # the old model kept until then
        random_hf_model(staging, TINY_LLAMA3, seed)
        if tokenizer is not None:
            for name in TOKENIZER_FILES:
                if (tokenizer / name).is_file():
                    shutil.copyfile(tokenizer / name, staging / name)
    return folder
