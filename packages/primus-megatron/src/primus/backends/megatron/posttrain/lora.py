"""LoRA on Megatron's GPT model: Primus's own (no Megatron-Bridge, no Transformer Engine).

Each targeted Hugging Face projection gets its own adapter pair, y += (alpha / r) * B A x,
on the fused Megatron linear that holds it; the pieces join the linear's output in the
layout hf_mapping gives its weight (per query group q, k, v; [gate; up]):

    q_proj, k_proj, v_proj   -> self_attention.linear_qkv
    o_proj                   -> self_attention.linear_proj
    gate_proj, up_proj       -> mlp.linear_fc1
    down_proj                -> mlp.linear_fc2

A is drawn like nn.Linear's default, B starts at zero (the adapted model starts as the base).
With `init_from.adapter`, A and B start from that PEFT adapter's instead.
The base is frozen and loaded from the run's HF import (iteration 0); the model's sharded
state dict holds only the adapters, so checkpoints hold only them (and their optimizer state).
Export merges W_hf += (alpha / r) * B A per HF tensor, or writes each A and B under its HF
module's name as a PEFT adapter. Tensor parallel 1, dense models, local
layers (the LayerNorm Transformer Engine fuses into linear_qkv would hide the adapter's input).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from primus.backends.megatron.checkpoint.hf_mapping import Layout, Param, params, to_megatron
from primus.core.checkpoint.peft_adapter import read_adapter
from primus.core.errors import ConfigError
from primus.core.posttrain import PeftConfig

# The fused Megatron linear (under decoder.layers.) holding each HF projection.
FUSED = {
    "q_proj": "self_attention.linear_qkv", "k_proj": "self_attention.linear_qkv",
    "v_proj": "self_attention.linear_qkv", "o_proj": "self_attention.linear_proj",
    "gate_proj": "mlp.linear_fc1", "up_proj": "mlp.linear_fc1", "down_proj": "mlp.linear_fc2",
}  # fmt: skip
ADAPTER = ".lora."  # in the state-dict key of every adapter tensor
HF_BLOCKS = {"self_attention": "self_attn", "mlp": "mlp"}  # Megatron's block -> HF's


def adapter_key(name: str, side: str) -> str:
    """The checkpoint key of adapter `side` (a or b) of HF projection `name` (all layers)."""
    return f"decoder.layers.{FUSED[name]}.lora.{side}.{name}.weight"


def target(hf_name: str) -> str:
    """`q_proj` for `model.layers.{i}.self_attn.q_proj.weight`."""
    return hf_name.split(".")[-2]


def describe(peft: PeftConfig) -> str:
    start = f"; the adapters start from {peft.adapter}" if peft.adapter else ""
    return (
        f"rank {peft.rank}, alpha {peft.alpha:g} (scaling {peft.scaling:g}), dropout "
        f"{peft.dropout:g}, on {', '.join(peft.target_modules)}{start}"
    )


class LoRA(torch.nn.Module):
    """The adapters of one fused linear: A (rank x in) and B (out x rank) per targeted part."""

    def __init__(self, param: Param, layout: Layout, peft: PeftConfig) -> None:
        super().__init__()
        self.param, self.layout, self.scaling = param, layout, peft.scaling
        named = [(target(name), shape) for name, shape in zip(param.hf, param.shapes, strict=True)]
        self.parts = [(name, shape[0]) for name, shape in named]
        self.a, self.b = torch.nn.ModuleDict(), torch.nn.ModuleDict()
        for name, (out, inp) in named:
            if name in peft.target_modules:
                self.a[name] = torch.nn.Linear(inp, peft.rank, bias=False)
                self.b[name] = b = torch.nn.Linear(peft.rank, out, bias=False)
                torch.nn.init.zeros_(b.weight)
        self.dropout = torch.nn.Dropout(peft.dropout)
        self.enabled = True  # off: the linear gives the base's output (`adapters_off`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(x)
        pieces = [
            self.b[name](self.a[name](x)) if name in self.a else x.new_zeros(*x.shape[:-1], out)
            for name, out in self.parts
        ]
        if len(pieces) == 1:
            return pieces[0] * self.scaling
        joined = to_megatron(self.param, [p.movedim(-1, 0) for p in pieces], self.layout)
        return joined.movedim(0, -1) * self.scaling


def _add_adapter(linear: torch.nn.Module, adapter: LoRA) -> None:
    linear.add_module("lora", adapter)

    def hook(module: torch.nn.Module, inputs: tuple[Any, ...], output: Any) -> Any:
        out, bias = output
        return (out + adapter(inputs[0]) if adapter.enabled else out), bias

    linear.register_forward_hook(hook)


@contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """`model` computes as its frozen base within: every LoRA adapter switched off."""
    adapters = [module for module in model.modules() if isinstance(module, LoRA)]
    for adapter in adapters:
        adapter.enabled = False
    try:
        yield
    finally:
        for adapter in adapters:
            adapter.enabled = True


def add_lora(model: Any, args: Any) -> None:
    """Freeze `model` (a GPTModel of one pipeline stage), add the adapters `args.primus_peft`
    asks for, load the frozen weights from `args.primus_lora_base` when set (the HF import),
    and make the model's sharded state dict the adapters only."""
    from primus.backends.megatron.checkpoint.hf_mapping import padded_vocab_size

    peft: PeftConfig = args.primus_peft
    layout = Layout.from_args(args, padded_vocab_size(args))
    table = {p.key: p for p in params(layout)}
    for param in model.parameters():
        param.requires_grad_(False)
    for layer in model.decoder.layers:
        for path in dict.fromkeys(FUSED.values()):
            adapter = LoRA(table[f"decoder.layers.{path}.weight"], layout, peft)
            if len(adapter.a):
                block, name = path.split(".")
                _add_adapter(getattr(getattr(layer, block), name), adapter)
    base = getattr(args, "primus_lora_base", None)
    if base:
        _load_base(model, base, args)
    if peft.adapter is not None:  # a resume loads the checkpoint's adapters over these
        _load_adapter(model, read_adapter(peft.adapter))
    full = model.sharded_state_dict

    def adapters_only(*a: Any, **k: Any) -> dict[str, Any]:
        return {key: v for key, v in full(*a, **k).items() if ADAPTER in key}

    model.sharded_state_dict = adapters_only


def import_weights(model: Any, folder: str, args: Any) -> dict[str, torch.Tensor]:
    """The weights of `model` (its frozen ones, with LoRA) in the Megatron checkpoint in
    `folder`, by state-dict key (model tensors only; some may be `model`'s own parameters,
    loaded in place)."""
    from megatron.core import dist_checkpointing
    from megatron.training.checkpointing import _build_sharded_state_dict_metadata

    metadata = _build_sharded_state_dict_metadata(args)
    wanted = {
        key: value
        for key, value in model.sharded_state_dict(metadata=metadata).items()
        if ADAPTER not in key and not key.endswith("_extra_state")
    }
    loaded = dist_checkpointing.load(wanted, folder)  # with the checkpoint's common state
    return {key: loaded[key] for key in wanted}


def _load_base(model: Any, folder: str, args: Any) -> None:
    """The frozen weights from the Megatron checkpoint in `folder` (model tensors only)."""
    missing, unexpected = model.load_state_dict(import_weights(model, folder, args), strict=False)
    assert not unexpected, unexpected
    left = [key for key in missing if ADAPTER not in key and not key.endswith("_extra_state")]
    assert not left, f"not in the HF import {folder}: {left}"


def _load_adapter(model: Any, factors: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Each adapter's A and B from a PEFT adapter's factors (`read_adapter`), by HF module:
    the layer's global number, its block and projection."""
    for layer in model.decoder.layers:
        for path in dict.fromkeys(FUSED.values()):
            block, name = path.split(".")
            adapter: Any = getattr(getattr(getattr(layer, block), name), "lora", None)
            for target in adapter.a if adapter is not None else ():
                module = f"model.layers.{layer.layer_number - 1}.{HF_BLOCKS[block]}.{target}"
                if module not in factors:
                    raise ConfigError(f"init_from.adapter: no adapter for {module}")
                linears = (adapter.a[target], adapter.b[target])
                pairs = zip("AB", linears, factors[module], strict=True)
                for side, linear, tensor in pairs:
                    if tensor.shape != linear.weight.shape:
                        raise ConfigError(
                            f"init_from.adapter: {module}'s lora_{side} has shape "
                            f"{list(tensor.shape)}, this model's {list(linear.weight.shape)}"
                        )
                    with torch.no_grad():
                        linear.weight.copy_(tensor)


def merge(
    hf_name: str, weight: torch.Tensor, adapters: dict[str, torch.Tensor], layer: int,
    scaling: float,
) -> torch.Tensor:  # fmt: skip
    """`weight` (the HF tensor `hf_name` of `layer`) with its adapter merged in, if it has one.
    `adapters`: the checkpoint's adapter tensors by key, each with a leading layer axis."""
    name = target(hf_name)
    if (
        name not in FUSED
        or not hf_name.endswith(".weight")
        or adapter_key(name, "a") not in adapters
    ):
        return weight
    a, b = adapters[adapter_key(name, "a")][layer], adapters[adapter_key(name, "b")][layer]
    return (weight.double() + b.double() @ a.double() * scaling).to(weight.dtype)


def hf_factors(adapters: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The checkpoint's adapters (by key, each with a leading layer axis) as (A, B) per HF
    module: `model.layers.{i}.self_attn.q_proj` and so on."""
    found = {}
    for name, fused in FUSED.items():
        if adapter_key(name, "a") not in adapters:
            continue
        a, b = adapters[adapter_key(name, "a")], adapters[adapter_key(name, "b")]
        block = HF_BLOCKS[fused.split(".")[0]]
        for layer in range(a.shape[0]):
            found[f"model.layers.{layer}.{block}.{name}"] = (a[layer], b[layer])
    return found
