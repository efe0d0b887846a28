"""The published Hugging Face configs of the models Primus ships presets for, built locally.

Each entry is the model's published `config.json` (the fields Primus reads), keyed by the
Primus preset name (the same name on every backend). `hf_inv_freq` is what transformers'
own rotary embedding builds for that config: the reference every backend's preset must match.
Needs `transformers` and `torch` (test-only).
"""

from __future__ import annotations

import importlib
import json
import math
import struct
from pathlib import Path
from typing import Any

from primus.core.checkpoint.tiny import LLAMA3_2_ROPE, TINY_LLAMA3, random_hf_model

LLAMA3_2 = LLAMA3_2_ROPE
LLAMA3_1 = {**LLAMA3_2, "factor": 8.0}

_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
          "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "max_position_embeddings": 131072,
          "vocab_size": 128256, "num_key_value_heads": 8, "head_dim": 128,
          "attention_bias": False, "mlp_bias": False}  # fmt: skip
_QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu",
          "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
          "vocab_size": 151936, "num_key_value_heads": 8, "head_dim": 128,
          "attention_bias": False, "use_sliding_window": False, "sliding_window": None}  # fmt: skip

HF_CONFIGS: dict[str, dict[str, Any]] = {
    "llama3.2_1B": {  # meta-llama/Llama-3.2-1B
        **_LLAMA, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
        "num_attention_heads": 32, "head_dim": 64, "rope_scaling": LLAMA3_2,
        "tie_word_embeddings": True,
    },
    "llama3.2_3B": {  # meta-llama/Llama-3.2-3B
        **_LLAMA, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
        "num_attention_heads": 24, "rope_scaling": LLAMA3_2, "tie_word_embeddings": True,
    },
    "llama3.1_8B": {  # meta-llama/Llama-3.1-8B
        **_LLAMA, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "rope_scaling": LLAMA3_1, "tie_word_embeddings": False,
    },
    "llama3.1_70B": {  # meta-llama/Llama-3.1-70B
        **_LLAMA, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
        "num_attention_heads": 64, "rope_scaling": LLAMA3_1, "tie_word_embeddings": False,
    },
    "mixtral_8x7B": {  # mistralai/Mixtral-8x7B-v0.1
        "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "hidden_act": "silu",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "max_position_embeddings": 32768,
        "vocab_size": 32000, "tie_word_embeddings": False, "sliding_window": None,
        "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
    },
    "qwen2.5_7B": {  # Qwen/Qwen2.5-7B
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu",
        "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0, "max_position_embeddings": 131072, "vocab_size": 152064,
        "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 131072,
    },
    "qwen3_0.6B": {  # Qwen/Qwen3-0.6B
        **_QWEN3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
        "num_attention_heads": 16, "tie_word_embeddings": True,
    },
    "qwen3_8B": {  # Qwen/Qwen3-8B
        **_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "tie_word_embeddings": False,
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


# Tiny models of each family, small enough for a CPU test: random weights, Llama-3 RoPE
# scaling where the family has it, untied embeddings unless a test ties them.
TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "llama3": TINY_LLAMA3,  # the product's (primus checkpoint tiny)
    "qwen2.5": {
        "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
        "vocab_size": 256, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False,
    },
    "qwen3": {
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 4096,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
        "use_sliding_window": False, "sliding_window": None,
    },
    "mixtral": {
        "model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "vocab_size": 256, "max_position_embeddings": 4096,
        "rope_theta": 1000000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "num_local_experts": 4, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
        "sliding_window": None,
    },
}  # fmt: skip


def make_hf_model(folder: Any, family: str, seed: int = 0, **changes: Any) -> Any:
    """Save a tiny random HF model of `family` (a key of TINY_CONFIGS, with `changes` to its
    config.json values) in `folder` as fp32 safetensors, drawn as `primus checkpoint tiny`
    draws its model; the folder."""
    return random_hf_model(Path(folder), {**TINY_CONFIGS[family], **changes}, seed)


def hf_logits(folder: Any, tokens: Any) -> Any:
    """transformers' fp32 logits (batch, seq, vocab) for `tokens` (batch, seq) of the HF
    model in `folder`: the reference every import and export is checked against."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits


def hf_loss(folder: Any, tokens: Any) -> float:
    """transformers' mean next-token cross-entropy on `tokens` (labels = tokens shifted)."""
    import torch

    logits = hf_logits(folder, tokens)
    tokens = torch.as_tensor(tokens)
    return float(
        torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)
        )
    )


def hf_adamw_losses(folder: Any, batches: Any, lr: float, max_norm: float) -> list[float]:
    """transformers' fp32 training of the HF model in `folder`, one step per batch of
    `batches` (rows of seq + 1 tokens: inputs [:, :-1], targets [:, 1:]): AdamW at the constant
    `lr` (betas 0.9, 0.95, eps 1e-8, no weight decay) on gradients clipped to the global norm
    `max_norm`; each step's loss."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0
    )
    losses = []
    for batch in batches:
        tokens = torch.as_tensor(batch)
        logits = model(tokens[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


def published_shapes(name: str) -> tuple[Any, dict[str, Any]]:
    """The HF config of the published model `name` (a key of HF_CONFIGS) and the shape of
    each tensor its checkpoint holds (none made: the model is built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(HF_CONFIGS[name])
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    with torch.device("meta"):
        shapes = {
            k: v.shape for k, v in AutoModelForCausalLM.from_config(config).state_dict().items()
        }
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return config, shapes


def make_published_shell(folder: Path, name: str) -> Path:
    """The published model `name` as a folder that reads as it (its config.json, and a
    model.safetensors whose header lists every tensor at full size) but holds zeros in a
    sparse file: no disk, no time. For dry runs, which read headers but no weights."""
    config, shapes = published_shapes(name)
    config.save_pretrained(folder)
    header, offset = {}, 0
    for key, shape in shapes.items():
        size = 2 * math.prod(shape)  # bf16
        header[key] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with (folder / "model.safetensors").open("wb") as out:
        out.write(struct.pack("<Q", len(text)) + text)
        out.truncate(8 + len(text) + offset)
    return folder


def make_published_model(folder: Path, name: str) -> int:
    """Save a random bf16 HF model of the published config `name` (a key of HF_CONFIGS) in
    `folder`, one safetensors shard per layer (plus one for the rest), as published checkpoints
    are sharded; its tensor bytes. Tensors are made one shard at a time (no model is built)."""
    import torch
    from safetensors.torch import save_file

    config, shapes = published_shapes(name)
    shards: dict[str, list[str]] = {}
    for key in shapes:
        part = key.split(".")
        shards.setdefault(f"layer{part[2]}" if part[1] == "layers" else "rest", []).append(key)
    folder.mkdir(parents=True)
    index: dict[str, str] = {}
    total = 0
    generator = torch.Generator().manual_seed(0)
    for number, keys in enumerate(shards.values()):
        file = f"model-{number + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {k: (torch.randn(shapes[k], generator=generator) * 0.02).bfloat16() for k in keys}
        save_file(tensors, folder / file, metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        index |= dict.fromkeys(keys, file)
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index})
    )
    config.dtype = torch.bfloat16
    config.save_pretrained(folder)
    return total
