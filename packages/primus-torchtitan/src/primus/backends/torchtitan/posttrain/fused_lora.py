"""Primus's LoRA on TorchTitan's fused q/k/v projection (`qkv_linear.wqkv`), as PEFT's per
module: each targeted part (`wq`, `wk`, `wv`: HF's q_proj, k_proj, v_proj) has its own A
(rank x in) and B (part rows x rank), and adds (alpha / rank) B A x to that part's rows of the
fused output (TorchTitan's layout: per kv group, its q heads, then k, then v), so B's rows are
in the order of TorchTitan's `wq`/`wk`/`wv` weight. The A's and B's are TorchTitan Linears
sharded as its LoRA linear shards its own (A replicated, B as the fused weight's rows under
tensor parallel; FSDP shards them as any parameter).

`LoRAConverter`: TorchTitan's, on the unfused linears its `target_modules` name, with this
adapter on every fused wqkv when `qkv` names parts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import nn

from torchtitan.components.lora import LoRAConverter as TitanLoRAConverter
from torchtitan.components.lora import _lora_adapter_sharding
from torchtitan.models.common import Linear
from torchtitan.models.common.attention import FusedQKVLinear
from torchtitan.protocols.module import ModuleDict
from torchtitan.trainer import spmd  # spmd_types, as TorchTitan's modules use it

PARTS = ("wq", "wk", "wv")  # the fused output's parts, as TorchTitan's checkpoints name them


def heads(heads_per_kv: int) -> dict[str, int]:
    """Each part's heads in a kv group of the fused output."""
    return dict(zip(PARTS, (heads_per_kv, 1, 1), strict=True))


_classes: dict[type, Any] = {}


def qkv_lora_cls(parent: type) -> Any:
    """The fused q/k/v Linear of class `parent` (TorchTitan's Linear, or a float8 one),
    frozen, with a LoRA adapter on each targeted part (one class per parent)."""
    if parent in _classes:
        return _classes[parent]

    class QKVLoRALinear(parent):  # type: ignore[valid-type, misc]
        @dataclass(kw_only=True, slots=True)
        class Config(parent.Config):  # type: ignore[name-defined, misc]
            rank: int
            alpha: float
            head_dim: int
            heads_per_kv: int
            parts: tuple[str, ...]  # the targeted ones among PARTS

            def part_rows(self) -> dict[str, int]:
                """Each targeted part's rows of the fused output (its B's rows)."""
                groups = self.out_features // (self.head_dim * (self.heads_per_kv + 2))
                width = heads(self.heads_per_kv)
                return {part: groups * width[part] * self.head_dim for part in self.parts}

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            for param in nn.Module.parameters(self):
                param.requires_grad_(False)
            self._lora_scaling = config.alpha / config.rank  # 0: the base (`adapters_off`)
            self.widths = {p: n * config.head_dim for p, n in heads(config.heads_per_kv).items()}
            a_sharding, b_sharding = _lora_adapter_sharding(config.sharding_config)
            self.lora_a, self.lora_b = ModuleDict(), ModuleDict()
            for part, rows in config.part_rows().items():
                self.lora_a[part] = Linear.Config(
                    in_features=config.in_features, out_features=config.rank,
                    sharding_config=a_sharding,
                    param_init={"weight": lambda w: nn.init.kaiming_uniform_(w, a=math.sqrt(5))},
                ).build()  # fmt: skip
                self.lora_b[part] = Linear.Config(
                    in_features=config.rank, out_features=rows, sharding_config=b_sharding,
                    param_init={"weight": nn.init.zeros_},
                ).build()  # fmt: skip

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            base = super().forward(input)
            pieces = {part: self.lora_b[part](self.lora_a[part](input)) for part in self.lora_a}
            with spmd.local():  # local rows: tensor parallel splits each part by kv groups
                groups = base.shape[-1] // sum(self.widths.values())
                columns = [
                    pieces[part].unflatten(-1, (groups, width))
                    if part in pieces
                    else base.new_zeros(*base.shape[:-1], groups, width)
                    for part, width in self.widths.items()
                ]
                update = torch.cat(columns, dim=-1).flatten(-2)
            return base + self._lora_scaling * update

    QKVLoRALinear.__name__ = QKVLoRALinear.__qualname__ = f"QKVLoRA{parent.__name__}"
    _classes[parent] = QKVLoRALinear
    return QKVLoRALinear


class LoRAConverter(TitanLoRAConverter):
    """TorchTitan's LoRAConverter, each fused wqkv a `qkv_lora_cls` Linear on the `qkv` parts."""

    @dataclass(kw_only=True, slots=True)
    class Config(TitanLoRAConverter.Config):
        qkv: list[str] = field(default_factory=list)
        """The targeted parts of the fused q/k/v projection (among PARTS)."""

    def convert(self, model_config: Any) -> Any:
        parts = tuple(p for p in PARTS if p in self.config.qkv)
        fused = model_config.traverse(FusedQKVLinear.Config, recurse=True) if parts else ()
        for _, attention, _, _ in list(fused):
            wqkv = attention.wqkv
            attention.wqkv = qkv_lora_cls(wqkv._owner).Config(
                **{f.name: getattr(wqkv, f.name) for f in fields(wqkv) if f.init},
                rank=self.rank, alpha=self.alpha, head_dim=attention.head_dim,
                heads_per_kv=attention.n_heads // attention.n_kv_heads, parts=parts,
            )  # fmt: skip
        return super().convert(model_config)
