"""LoRA on TorchTitan: its own `LoRAConverter` (a model-config converter: each targeted Linear
becomes a LoRA linear, frozen, with trainable `lora_a` (rank x in) and `lora_b` (out x rank,
zeros), the update scaled by alpha / rank; every other parameter frozen).

Core's `peft.target_modules` are HF (Llama-family) names; TorchTitan's llama3 fuses q, k and v
into one Linear (`qkv_linear.wqkv`), so `q_proj`, `k_proj`, `v_proj` are targeted together (one
adapter on the fused projection) or not at all. The frozen weights come from the run's HF
import, loaded by Primus (fresh run and resume alike); checkpoints hold the adapters only.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from primus.core.posttrain import PeftConfig

# HF name -> TorchTitan Linear (the last segment of its FQN)
LINEARS = {"o_proj": "wo", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
QKV = ("q_proj", "k_proj", "v_proj")
FUSED_QKV = "wqkv"
ADAPTER = (".lora_a.", ".lora_b.")


def is_adapter(key: str) -> bool:
    return any(part in key for part in ADAPTER)


def converter(peft: PeftConfig) -> Any:
    """TorchTitan's LoRAConverter.Config for `peft:` (checked by `checks.check_peft`)."""
    from torchtitan.components.lora import LoRAConverter

    targets = list(peft.target_modules)
    qkv = [t for t in targets if t in QKV]
    names = [LINEARS[t] for t in targets if t in LINEARS] + ([FUSED_QKV] if qkv else [])
    return LoRAConverter.Config(rank=peft.rank, alpha=peft.alpha, target_modules=names)


def load_base(model: Any, folder: Path) -> int:
    """The frozen weights (every tensor but the adapters) from the DCP folder of the HF
    import into `model`; how many were loaded."""
    import torch.distributed.checkpoint as dcp

    state = {k: v for k, v in model.state_dict().items() if not is_adapter(k)}
    dcp.load(state, checkpoint_id=str(folder))
    model.load_state_dict(state, strict=False)  # through the wq/wk/wv -> wqkv hook
    return len(state)


def init_adapters(model: Any, seed: int) -> None:
    """Draw each adapter's A anew (B stays zeros) from one generator, over the whole tensor,
    as nn.Linear draws its weight: the same start whatever the sharding (TorchTitan draws on
    each rank's shard, so several data-parallel ranks would start elsewhere than one)."""
    import math

    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if not name.endswith(".lora_a.weight"):
                continue
            bound = 1 / math.sqrt(param.shape[1])  # kaiming_uniform_(a=sqrt(5))
            full = torch.empty(param.shape, dtype=param.dtype).uniform_(
                -bound, bound, generator=generator
            )
            if isinstance(param, DTensor):
                mesh = param.device_mesh
                full = distribute_tensor(full.to(mesh.device_type), mesh, param.placements)
            param.copy_(full)


def adapted_linears(config: Any) -> dict[str, Any]:
    """FQN -> LoRA linear config of each adapted Linear of Trainer.Config `config`'s model."""
    from torchtitan.models.common import Linear

    return {
        fqn: cfg
        for fqn, cfg, _, _ in config.model_spec.model.traverse(Linear.Config, recurse=True)
        if hasattr(cfg, "rank") and hasattr(cfg, "alpha")
    }


def factors(config: Any, adapters: dict[str, Any]) -> dict[str, tuple[Any, Any, float]]:
    """Native weight key -> (A, B, alpha / rank) of its LoRA update: the fused qkv adapter's B
    split into wq/wk/wv rows as TorchTitan splits wqkv (A is theirs in common)."""
    from types import SimpleNamespace

    from torchtitan.models.common.attention import FusedQKVLinear

    model = config.model_spec.model
    attention = model.layers[0].attention
    heads = attention.n_heads
    kv = attention.n_kv_heads or heads
    head_dim = attention.qkv_linear.head_dim or model.dim // heads
    shape = SimpleNamespace(head_dim=head_dim, heads_per_kv=heads // kv, r_dim=heads // kv + 2)
    found = {}
    for fqn, cfg in adapted_linears(config).items():
        a, b = (adapters[f"{fqn}.lora_{side}.weight"] for side in "ab")
        parts = {f"{fqn}.weight": b}
        if fqn.endswith(f".{FUSED_QKV}"):
            FusedQKVLinear._split_qkv_on_save(shape, parts, fqn.removesuffix(FUSED_QKV), None)
        found.update({key: (a, part, cfg.alpha / cfg.rank) for key, part in parts.items()})
    return found


def updates(config: Any, adapters: dict[str, Any]) -> dict[str, Any]:
    """Native weight key -> a function giving its LoRA update (alpha / rank) B A in float64."""

    def update(a: Any, b: Any, scaling: float) -> Any:
        return scaling * (b.double() @ a.double())

    return {key: partial(update, *found) for key, found in factors(config, adapters).items()}
