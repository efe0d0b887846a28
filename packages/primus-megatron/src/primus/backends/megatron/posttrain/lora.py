"""LoRA on Megatron's GPT model: Primus's own (no Megatron-Bridge, no Transformer Engine).

Each targeted Hugging Face projection gets its own adapter pair, y += (alpha / r) * B A x,
on the fused Megatron linear that holds it; the pieces join the linear's output in the
layout hf_mapping gives its weight (per query group q, k, v; [gate; up]):

    q_proj, k_proj, v_proj   -> self_attention.linear_qkv    (column-parallel)
    o_proj                   -> self_attention.linear_proj   (row-parallel)
    gate_proj, up_proj       -> mlp.linear_fc1               (column-parallel)
    down_proj                -> mlp.linear_fc2               (row-parallel)

Tensor parallel: on a column-parallel linear (output split) every rank holds the whole A and
B's rows for its slice of the output (its query groups; its part of gate and of up), A's
gradient all-reduced over the TP group (Megatron's copy-to-region); on a row-parallel one
(input split) A's columns for the rank's input slice and the whole B, the partial A x summed
over the group (reduce-from-region) before B. Replicated factors get identical gradients on
every rank; the sharded ones carry Megatron's TP attributes (gradient norm) and TP axis in
the sharded state dict, so checkpoints hold whole A and B as at TP 1.

A is drawn like nn.Linear's default over the whole tensor, from a generator seeded with the
run's seed and the layer's number, then sharded; B starts at zero (the adapted model starts
as the base), so any TP starts alike. Dropout draws its mask over the whole input alike.
With `init_from.adapter`, A and B start from that PEFT adapter's (sharded) instead.
The base is frozen and loaded from the run's HF import (iteration 0); the model's sharded
state dict holds only the adapters, so checkpoints hold only them (and their optimizer state).
Export merges W_hf += (alpha / r) * B A per HF tensor, or writes each A and B under its HF
module's name as a PEFT adapter. Dense models, local layers (the LayerNorm Transformer Engine
fuses into linear_qkv would hide the adapter's input), no sequence parallel.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

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
# The axis of each fused linear's weight that tensor parallel splits: 0 its output
# (column-parallel), 1 its input (row-parallel); SHARDED[axis]: the factor split with it.
SPLIT = {"self_attention.linear_qkv": 0, "self_attention.linear_proj": 1,
         "mlp.linear_fc1": 0, "mlp.linear_fc2": 1}  # fmt: skip
SHARDED = ("b", "a")
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


def _linear(weight: torch.Tensor) -> torch.nn.Linear:
    """A bias-free nn.Linear holding `weight` (drawing nothing from the default generator)."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = torch.nn.Parameter(weight)
    return linear


class LoRA(torch.nn.Module):
    """The adapters of one fused linear on one tensor-parallel rank of `group`: A (rank x in)
    and B (out x rank) per targeted part, the factor SHARDED on the linear's `split` axis
    holding this rank's slice. A is drawn from `generator` over the whole tensor."""

    def __init__(
        self, param: Param, layout: Layout, peft: PeftConfig, split: int, group: Any,
        generator: torch.Generator,
    ) -> None:  # fmt: skip
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
        from megatron.core.utils import get_pg_rank, get_pg_size

        super().__init__()
        self.param, self.scaling, self.p = param, peft.scaling, peft.dropout
        self.split, self.group, self.sharded = split, group, SHARDED[split]
        self.tp, self.tp_rank = get_pg_size(group), get_pg_rank(group)
        per_rank = 1 if split else self.tp  # the output this rank's linear holds
        self.layout = replace(layout, heads=layout.heads // per_rank,
                              groups=layout.groups // per_rank)  # fmt: skip
        named = [(target(name), shape) for name, shape in zip(param.hf, param.shapes, strict=True)]
        self.parts = [(name, shape[0] // per_rank) for name, shape in named]
        self.a, self.b = torch.nn.ModuleDict(), torch.nn.ModuleDict()
        for name, (out, inp) in named:
            if name not in peft.target_modules:
                continue
            bound = 1 / math.sqrt(inp)  # nn.Linear's default init of the whole A
            a = torch.empty(peft.rank, inp).uniform_(-bound, bound, generator=generator)
            self.a[name] = _linear(self.shard("a", a).clone())
            self.b[name] = _linear(self.shard("b", torch.zeros(out, peft.rank)).clone())
            factor = getattr(self, self.sharded)[name].weight
            set_tensor_model_parallel_attributes(factor, True, split, 1)
        self.enabled = True  # off: the linear gives the base's output (`adapters_off`)

    def shard(self, side: str, whole: torch.Tensor) -> torch.Tensor:
        """This rank's part of the whole factor `side` (a or b)."""
        if side != self.sharded:
            return whole
        size = whole.shape[self.split] // self.tp
        return whole.narrow(self.split, self.tp_rank * size, size)

    def whole_shape(self, side: str, name: str) -> list[int]:
        """The shape of the whole factor `side` (a or b) of part `name`."""
        shape = list(getattr(self, side)[name].weight.shape)
        if side == self.sharded:
            shape[self.split] *= self.tp
        return shape

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        """Dropout with the mask drawn over the whole input (split: this rank's slice)."""
        if not self.training or not self.p:
            return x
        width = x.shape[-1] * (self.tp if self.split else 1)
        keep = x.new_empty(*x.shape[:-1], width).bernoulli_(1 - self.p)
        if self.split:
            keep = keep.narrow(-1, self.tp_rank * x.shape[-1], x.shape[-1])
        return x * keep / (1 - self.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import (
            copy_to_tensor_model_parallel_region,
            reduce_from_tensor_model_parallel_region,
        )

        x = self._dropout(x)
        low = F.linear(x, torch.cat([self._factor("a", name) for name in self.a]))  # each A x
        if self.tp > 1:  # row-parallel: sum the partial A x; column: all-reduce A's gradient
            region = (reduce_from_tensor_model_parallel_region if self.split
                      else copy_to_tensor_model_parallel_region)  # fmt: skip
            low = region(low, group=self.group)
        return F.linear(low, self._joined_b())

    def _factor(self, side: str, name: str) -> torch.Tensor:
        """The weight of factor `side` (a or b) of part `name`."""
        linear = getattr(self, side)[name]
        assert isinstance(linear, torch.nn.Linear)
        return linear.weight

    def _joined_b(self) -> torch.Tensor:
        """Every part's B, scaled, as one (out x parts * rank) matrix whose rows are in the
        fused linear's order: one GEMM gives the adapters' output in Megatron's layout (the
        rows of B are rearranged, not the activations), zero for the parts not targeted."""
        names = list(self.a)
        rank = int(self._factor("b", names[0]).shape[1])
        width = rank * len(names)
        blocks = []
        for name, out in self.parts:
            if name in self.b:
                at = names.index(name) * rank
                blocks.append(F.pad(self._factor("b", name), (at, width - at - rank)))
            else:
                blocks.append(self._factor("b", names[0]).new_zeros(out, width))
        joined = blocks[0] if len(blocks) == 1 else to_megatron(self.param, blocks, self.layout)
        return joined * self.scaling


def _add_adapter(linear: Any, adapter: LoRA) -> None:
    """`adapter` on the output of `linear` (a Megatron parallel linear), its factors in the
    linear's sharded state dict."""
    linear.add_module("lora", adapter)

    def hook(module: torch.nn.Module, inputs: tuple[Any, ...], output: Any) -> Any:
        out, bias = output
        return (out + adapter(inputs[0]) if adapter.enabled else out), bias

    linear.register_forward_hook(hook)
    own = linear.sharded_state_dict

    def sharded_state_dict(
        prefix: str = "", sharded_offsets: tuple[Any, ...] = (), metadata: Any = None
    ) -> dict[str, Any]:
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        tensors: dict[str, Any] = own(prefix, sharded_offsets, metadata)
        factors = adapter.state_dict(keep_vars=True)
        axes = {key: adapter.split for key in factors if key.startswith(f"{adapter.sharded}.")}
        tensors |= make_sharded_tensors_for_checkpoint(
            factors, f"{prefix}lora.", axes, sharded_offsets, tp_group=adapter.group,
            dp_cp_group=metadata["dp_cp_group"],
        )  # fmt: skip
        return tensors

    linear.sharded_state_dict = sharded_state_dict


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
        generator = torch.Generator().manual_seed(args.seed * 10_000 + layer.layer_number)
        for path in dict.fromkeys(FUSED.values()):
            block, name = path.split(".")
            linear = getattr(getattr(layer, block), name)
            param = table[f"decoder.layers.{path}.weight"]
            adapter = LoRA(param, layout, peft, SPLIT[path], linear.tp_group, generator)
            if len(adapter.a):
                _add_adapter(linear, adapter)
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
                for side, tensor in zip("ab", factors[module], strict=True):
                    whole = adapter.whole_shape(side, target)
                    if list(tensor.shape) != whole:
                        raise ConfigError(
                            f"init_from.adapter: {module}'s lora_{side.upper()} has shape "
                            f"{list(tensor.shape)}, this model's {whole}"
                        )
                    with torch.no_grad():
                        getattr(adapter, side)[target].weight.copy_(adapter.shard(side, tensor))


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
