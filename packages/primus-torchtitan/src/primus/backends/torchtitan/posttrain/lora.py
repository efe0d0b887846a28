"""LoRA on TorchTitan: Primus's `fused_lora.LoRAConverter` (a model-config converter: each
targeted Linear gets trainable `lora_a` (rank x in) and `lora_b` (out x rank, zeros), its update
scaled by alpha / rank; every other parameter frozen).

Core's `peft.target_modules` are HF (Llama-family) names. o_proj, gate_proj, up_proj and
down_proj are TorchTitan's LoRA linears (its LoRAConverter). TorchTitan's llama3 and qwen3 fuse
q, k and v into one Linear (`qkv_linear.wqkv`): any of `q_proj`, `k_proj`, `v_proj` gets its
own A and B on that linear's rows of its part (`fused_lora`), as PEFT's adapter per module.
`peft.dropout` drops each adapter's input (`add_dropout`; TorchTitan's LoRA has none). The
frozen weights come from the run's HF import, loaded by Primus (fresh run and resume alike);
checkpoints hold the adapters only. `adapters_off` switches the adapters off (DPO's reference:
the base model).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from primus.core.posttrain import PeftConfig

# HF name -> TorchTitan Linear (the last segment of its FQN)
LINEARS = {"o_proj": "wo", "gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
# HF name -> its part of the fused q/k/v Linear, named as TorchTitan's checkpoints name it
QKV = {"q_proj": "wq", "k_proj": "wk", "v_proj": "wv"}
FUSED_QKV = "wqkv"
ADAPTER = (".lora_a.", ".lora_b.")


def is_adapter(key: str) -> bool:
    return any(part in key for part in ADAPTER)


def converter(peft: PeftConfig) -> Any:
    """The LoRAConverter.Config (`fused_lora`) for `peft:`."""
    from primus.backends.torchtitan.posttrain.fused_lora import LoRAConverter

    targets = list(peft.target_modules)
    return LoRAConverter.Config(
        rank=peft.rank, alpha=peft.alpha, target_modules=[LINEARS[t] for t in targets if t in LINEARS],
        qkv=[QKV[t] for t in targets if t in QKV],
    )  # fmt: skip


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
            if ".lora_a." not in name:
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
    `lora_dropout` (one per adapter, q's and v's apart): TorchTitan's LoRA linear feeds its
    input to `lora_a` as is. How many adapters got it."""
    import torch

    def drop(module: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        return (torch.nn.functional.dropout(inputs[0], p, module.training), *inputs[1:])

    adapters = [
        module
        for name, module in model.named_modules()
        if ".lora_a" in f".{name}" and isinstance(module, torch.nn.Linear)
    ]
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


def adapter_keys(config: Any) -> dict[str, tuple[str, str, float]]:
    """Native weight key -> the parameter names of its LoRA A and B, and alpha / rank: each
    targeted part of a fused wqkv under its own key (`....wq.weight`, ...)."""
    found = {}
    for fqn, cfg in adapted_linears(config).items():
        scaling = cfg.alpha / cfg.rank
        if not hasattr(cfg, "parts"):
            found[f"{fqn}.weight"] = (f"{fqn}.lora_a.weight", f"{fqn}.lora_b.weight", scaling)
            continue
        prefix = fqn.removesuffix(FUSED_QKV)
        for part in cfg.parts:
            a, b = (f"{fqn}.lora_{side}.{part}.weight" for side in "ab")
            found[f"{prefix}{part}.weight"] = (a, b, scaling)
    return found


def factors(config: Any, adapters: dict[str, Any]) -> dict[str, tuple[Any, Any, float]]:
    """Native weight key -> (A, B, alpha / rank) of its LoRA update, from the adapter
    parameters `adapters` (whole tensors by name)."""
    return {
        key: (adapters[a], adapters[b], scaling)
        for key, (a, b, scaling) in adapter_keys(config).items()
    }


def native_adapters(config: Any, factor: Callable[[str], tuple[Any, Any]]) -> dict[str, Any]:
    """The adapter parameters (whole tensors by name) from `factor`, which gives (A, B) per
    native weight key: the inverse of `factors`."""
    found = {}
    for key, (a, b, _) in adapter_keys(config).items():
        found[a], found[b] = factor(key)
    return found


def updates(config: Any, adapters: dict[str, Any]) -> dict[str, Any]:
    """Native weight key -> a function giving its LoRA update (alpha / rank) B A in float64."""

    def update(a: Any, b: Any, scaling: float) -> Any:
        return scaling * (b.double() @ a.double())

    return {key: partial(update, *found) for key, found in factors(config, adapters).items()}
