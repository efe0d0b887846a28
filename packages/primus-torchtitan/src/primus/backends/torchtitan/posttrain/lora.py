"""LoRA on TorchTitan: its own `LoRAConverter` (a model-config converter: each targeted Linear
becomes a LoRA linear, frozen, with trainable `lora_a` (rank x in) and `lora_b` (out x rank,
zeros), the update scaled by alpha / rank; every other parameter frozen).

Core's `peft.target_modules` are HF (Llama-family) names; TorchTitan's llama3 fuses q, k and v
into one Linear (`qkv_linear.wqkv`), so `q_proj`, `k_proj`, `v_proj` are targeted together (one
adapter on the fused projection) or not at all. `peft.dropout` drops the adapters' input
(`add_dropout`; TorchTitan's LoRA has none). The frozen weights come from the run's HF
import, loaded by Primus (fresh run and resume alike); checkpoints hold the adapters only.
`adapters_off` switches the adapters off (DPO's reference: the base model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError
from primus.core.posttrain import PeftConfig

# HF name -> TorchTitan Linear (the last segment of its FQN)
LINEARS = {"o_proj": "wo", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
QKV = ("q_proj", "k_proj", "v_proj")
QKV_NATIVE = ("wq", "wk", "wv")  # TorchTitan's unfused names, as its checkpoints hold them
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


def _copy_whole(param: Any, full: Any) -> None:
    """Copy the whole (unsharded) tensor `full` into `param`, sharded as it is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(param, DTensor):
        mesh = param.device_mesh
        full = distribute_tensor(full.to(mesh.device_type), mesh, param.placements)
    param.copy_(full)


def init_adapters(model: Any, seed: int) -> None:
    """Draw each adapter's A anew (B stays zeros) from one generator, over the whole tensor,
    as nn.Linear draws its weight: the same start whatever the sharding (TorchTitan draws on
    each rank's shard, so several data-parallel ranks would start elsewhere than one)."""
    import math

    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if not name.endswith(".lora_a.weight"):
                continue
            bound = 1 / math.sqrt(param.shape[1])  # kaiming_uniform_(a=sqrt(5))
            full = torch.empty(param.shape, dtype=param.dtype).uniform_(
                -bound, bound, generator=generator
            )
            _copy_whole(param, full)


def set_adapters(model: Any, adapters: dict[str, Any]) -> None:
    """Each adapter parameter from `adapters` (`native_adapters`: whole tensors by name)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if is_adapter(name):
                _copy_whole(param, adapters[name].to(param.dtype))


def add_dropout(model: Any, p: float) -> int:
    """Dropout with probability `p` on each adapter's input (in training only), as PEFT's
    `lora_dropout`: TorchTitan's LoRA linear feeds its input to `lora_a` as is. How many
    adapters got it."""
    import torch

    def drop(module: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return (torch.nn.functional.dropout(inputs[0], p, module.training), *inputs[1:])

    adapters = [m.lora_a for m in model.modules() if hasattr(m, "lora_a")]
    for lora_a in adapters:
        lora_a.register_forward_pre_hook(drop)
    return len(adapters)


@contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """The model without its LoRA updates inside the block: each LoRA linear's scaling
    (TorchTitan's `_lora_scaling`, alpha / rank) is 0, so it gives its base output."""
    linears = [m for m in model.modules() if hasattr(m, "_lora_scaling")]
    scalings = [m._lora_scaling for m in linears]
    for linear in linears:
        linear._lora_scaling = 0.0
    try:
        yield
    finally:
        for linear, scaling in zip(linears, scalings, strict=True):
            linear._lora_scaling = scaling


def adapted_linears(config: Any) -> dict[str, Any]:
    """FQN -> LoRA linear config of each adapted Linear of Trainer.Config `config`'s model."""
    from torchtitan.models.common import Linear

    return {
        fqn: cfg
        for fqn, cfg, _, _ in config.model_spec.model.traverse(Linear.Config, recurse=True)
        if hasattr(cfg, "rank") and hasattr(cfg, "alpha")
    }


def _qkv_shape(config: Any) -> Any:
    """What TorchTitan's wqkv split and merge read of the attention (as its module)."""
    from types import SimpleNamespace

    model = config.model_spec.model
    attention = model.layers[0].attention
    heads = attention.n_heads
    kv = attention.n_kv_heads or heads
    head_dim = attention.qkv_linear.head_dim or model.dim // heads
    return SimpleNamespace(head_dim=head_dim, heads_per_kv=heads // kv, r_dim=heads // kv + 2)


def factors(config: Any, adapters: dict[str, Any]) -> dict[str, tuple[Any, Any, float]]:
    """Native weight key -> (A, B, alpha / rank) of its LoRA update: the fused qkv adapter's B
    split into wq/wk/wv rows as TorchTitan splits wqkv (A is theirs in common)."""
    from torchtitan.models.common.attention import FusedQKVLinear

    found = {}
    for fqn, cfg in adapted_linears(config).items():
        a, b = (adapters[f"{fqn}.lora_{side}.weight"] for side in "ab")
        parts = {f"{fqn}.weight": b}
        if fqn.endswith(f".{FUSED_QKV}"):
            FusedQKVLinear._split_qkv_on_save(
                _qkv_shape(config), parts, fqn.removesuffix(FUSED_QKV), None
            )
        found.update({key: (a, part, cfg.alpha / cfg.rank) for key, part in parts.items()})
    return found


def native_adapters(config: Any, factor: Callable[[str], tuple[Any, Any]]) -> dict[str, Any]:
    """The adapter parameters (`....lora_a.weight`, `....lora_b.weight`) from `factor`, which
    gives (A, B) per native weight key: q, k and v's B joined into the fused adapter's as
    TorchTitan joins wqkv, their A the fused adapter's (they must share it)."""
    import torch

    from torchtitan.models.common.attention import FusedQKVLinear

    found = {}
    for fqn in adapted_linears(config):
        if not fqn.endswith(f".{FUSED_QKV}"):
            a, b = factor(f"{fqn}.weight")
        else:
            prefix = fqn.removesuffix(FUSED_QKV)
            parts = {f"{prefix}{w}.weight": factor(f"{prefix}{w}.weight") for w in QKV_NATIVE}
            (a, _), *others = parts.values()
            if not all(torch.equal(a, other) for other, _ in others):
                raise ConfigError(
                    f"init_from.adapter: q, k and v of {prefix.rstrip('.')} have different A; "
                    "TorchTitan's fused q/k/v adapter has one",
                    hint="continue this adapter on Megatron (an adapter per projection)",
                )
            state = {key: b for key, (_, b) in parts.items()}
            FusedQKVLinear._merge_qkv_on_load(_qkv_shape(config), state, prefix)
            b = state[f"{fqn}.weight"]
        found[f"{fqn}.lora_a.weight"], found[f"{fqn}.lora_b.weight"] = a, b
    return found


def updates(config: Any, adapters: dict[str, Any]) -> dict[str, Any]:
    """Native weight key -> a function giving its LoRA update (alpha / rank) B A in float64."""

    def update(a: Any, b: Any, scaling: float) -> Any:
        return scaling * (b.double() @ a.double())

    return {key: partial(update, *found) for key, found in factors(config, adapters).items()}
