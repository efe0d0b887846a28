"""The published Hugging Face configs of the models Primus ships presets for, built locally.

Each entry holds the `config.json` values that fix the rotary schedule and the router, keyed
by the Primus preset name (the same name on every backend). `hf_inv_freq` is what transformers'
own rotary embedding builds for that config: the reference every backend's preset must match.
Needs `transformers` and `torch` (test-only).
"""

from __future__ import annotations

import importlib
from typing import Any

_LLAMA3 = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0}
_LLAMA3_ORIGINAL = {"original_max_position_embeddings": 8192}
LLAMA3_1 = {**_LLAMA3, "factor": 8.0, **_LLAMA3_ORIGINAL}
LLAMA3_2 = {**_LLAMA3, "factor": 32.0, **_LLAMA3_ORIGINAL}

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama3.2_1B": {  # meta-llama/Llama-3.2-1B
        "model_type": "llama", "hidden_size": 2048, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "rope_theta": 500000.0,
        "rope_scaling": LLAMA3_2, "max_position_embeddings": 131072,
    },
    "llama3.2_3B": {  # meta-llama/Llama-3.2-3B
        "model_type": "llama", "hidden_size": 3072, "num_attention_heads": 24,
        "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 500000.0,
        "rope_scaling": LLAMA3_2, "max_position_embeddings": 131072,
    },
    "llama3.1_8B": {  # meta-llama/Llama-3.1-8B
        "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 500000.0,
        "rope_scaling": LLAMA3_1, "max_position_embeddings": 131072,
    },
    "llama3.1_70B": {  # meta-llama/Llama-3.1-70B
        "model_type": "llama", "hidden_size": 8192, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 500000.0,
        "rope_scaling": LLAMA3_1, "max_position_embeddings": 131072,
    },
    "mixtral_8x7B": {  # mistralai/Mixtral-8x7B-v0.1
        "model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
        "router_aux_loss_coef": 0.02,
    },
    "qwen2.5_7B": {  # Qwen/Qwen2.5-7B
        "model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "rope_theta": 1000000.0, "max_position_embeddings": 131072,
    },
    "qwen3_0.6B": {  # Qwen/Qwen3-0.6B
        "model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
    },
    "qwen3_8B": {  # Qwen/Qwen3-8B
        "model_type": "qwen3", "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
    },
}  # fmt: skip


def hf_config(model: str) -> Any:
    """The transformers config of `model` (a key of HF_CONFIGS)."""
    from transformers import AutoConfig

    values = dict(HF_CONFIGS[model])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def hf_inv_freq(model: str) -> Any:
    """The inverse frequencies (a float64 numpy array) of transformers' rotary embedding."""
    config = hf_config(model)
    modeling = importlib.import_module(
        f"transformers.models.{config.model_type}.modeling_{config.model_type}"
    )
    rotary = getattr(modeling, type(config).__name__.removesuffix("Config") + "RotaryEmbedding")
    return rotary(config).inv_freq.double().numpy()
