"""The HF <-> Megatron mapping: which Megatron tensor each HF tensor becomes, and how.

Primus's own table (Megatron-LM's and Megatron-Bridge's mappings were the reference), for the
families the HF side names: Llama 3, Qwen2.5 (QKV bias), Qwen3 (QK norm), Mixtral (MoE).
Megatron keys are those of its torch_dist checkpoints (local and Transformer Engine specs
alike); per-layer tensors have a leading layer axis (experts: layer and expert axes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from primus.core.errors import ConfigError


@dataclass(frozen=True)
class Layout:
    """The shapes a conversion needs, from Megatron's args."""

    num_layers: int
    hidden: int
    heads: int
    groups: int
    head_dim: int
    ffn: int
    vocab: int
    padded_vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    experts: int

    @classmethod
    def from_args(cls, args: Any, padded_vocab: int) -> Layout:
        """The shapes of the model `args` describe, refused unless an HF family has it."""
        check_expressible(args)
        return cls.of(args, padded_vocab)

    @classmethod
    def of(cls, args: Any, padded_vocab: int) -> Layout:
        """The shapes of the model `args` describe, whatever its family."""
        heads = args.num_attention_heads
        return cls(
            num_layers=args.num_layers,
            hidden=args.hidden_size,
            heads=heads,
            groups=args.num_query_groups if args.group_query_attention else heads,
            head_dim=args.kv_channels or args.hidden_size // heads,
            ffn=(args.moe_ffn_hidden_size or args.ffn_hidden_size)
            if args.num_experts
            else args.ffn_hidden_size,
            vocab=args.vocab_size or padded_vocab,
            padded_vocab=padded_vocab,
            tied=not args.untie_embeddings_and_output_weights,
            qkv_bias=bool(args.add_qkv_bias),
            qk_norm=bool(args.qk_layernorm),
            experts=args.num_experts or 0,
        )


def check_expressible(args: Any) -> None:
    """A ConfigError for a Megatron model no supported HF family has."""
    wrong = {
        "normalization": (args.normalization, "RMSNorm"),
        "swiglu": (args.swiglu, True),
        "add_bias_linear": (args.add_bias_linear, False),
        "position_embedding_type": (args.position_embedding_type, "rope"),
        "rotary_interleaved": (args.rotary_interleaved, False),
        "rotary_percent": (args.rotary_percent, 1.0),
    }
    for key, (value, needed) in wrong.items():
        if value != needed:
            raise ConfigError(
                f"megatron model with '{key}: {value}' has no Hugging Face equivalent "
                f"(Llama 3, Qwen2.5, Qwen3 and Mixtral need {key}: {needed})"
            )
    if args.num_experts and (args.moe_grouped_gemm or args.moe_shared_expert_intermediate_size):
        raise ConfigError("megatron MoE: only Mixtral-style experts (moe_grouped_gemm: false, "
                          "no shared experts) convert to Hugging Face")  # fmt: skip
    if args.qk_layernorm and args.add_qkv_bias:
        raise ConfigError("megatron: qk_layernorm with add_qkv_bias has no Hugging Face family")


@dataclass(frozen=True)
class Param:
    """One Megatron tensor and the HF tensors it is made of.

    `hf` names take {i} (layer) and {e} (expert); `scope` says which of those index the
    Megatron tensor's leading axes; `join` how the HF tensors combine: "copy", "qkv" (per
    query group: its query heads, its key head, its value head), "rows" ([gate; up]) or
    "vocab" (rows padded to Megatron's padded vocabulary).
    """

    key: str
    hf: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    scope: str = "model"
    join: str = "copy"

    def indices(self, layout: Layout) -> list[tuple[int, ...]]:
        layers = range(layout.num_layers)
        if self.scope == "model":
            return [()]
        if self.scope == "layer":
            return [(i,) for i in layers]
        return [(i, e) for i in layers for e in range(layout.experts)]

    def names(self, index: tuple[int, ...]) -> list[str]:
        keys = dict(zip(("i", "e"), index, strict=False))
        return [name.format(**keys) for name in self.hf]


def params(layout: Layout) -> list[Param]:
    """Every Megatron model tensor of `layout` with its HF source (the mapping table)."""
    h, d, ffn = layout.hidden, layout.head_dim, layout.ffn
    q, kv = layout.heads * d, layout.groups * d
    layer, attn = "model.layers.{i}.", "model.layers.{i}.self_attn."
    mega, sa = "decoder.layers.", "decoder.layers.self_attention."
    table = [
        Param("embedding.word_embeddings.weight", ("model.embed_tokens.weight",),
              ((layout.vocab, h),), join="vocab"),
        Param("decoder.final_layernorm.weight", ("model.norm.weight",), ((h,),)),
        Param(sa + "linear_qkv.layer_norm_weight", (layer + "input_layernorm.weight",), ((h,),),
              "layer"),
        Param(sa + "linear_qkv.weight", tuple(f"{attn}{p}_proj.weight" for p in "qkv"),
              ((q, h), (kv, h), (kv, h)), "layer", "qkv"),
        Param(sa + "linear_proj.weight", (attn + "o_proj.weight",), ((h, q),), "layer"),
        Param(mega + "mlp.linear_fc1.layer_norm_weight",
              (layer + "post_attention_layernorm.weight",), ((h,),), "layer"),
    ]  # fmt: skip
    if not layout.tied:
        table.append(Param("output_layer.weight", ("lm_head.weight",), ((layout.vocab, h),),
                           join="vocab"))  # fmt: skip
    if layout.qkv_bias:
        table.append(Param(sa + "linear_qkv.bias", tuple(f"{attn}{p}_proj.bias" for p in "qkv"),
                           ((q,), (kv,), (kv,)), "layer", "qkv"))  # fmt: skip
    if layout.qk_norm:
        table += [Param(f"{sa}{p}_layernorm.weight", (f"{attn}{p}_norm.weight",), ((d,),), "layer")
                  for p in "qk"]  # fmt: skip
    if layout.experts:
        moe, experts = layer + "block_sparse_moe.", mega + "mlp.experts.experts."
        table += [
            Param(mega + "mlp.router.weight", (moe + "gate.weight",), ((layout.experts, h),),
                  "layer"),
            Param(experts + "linear_fc1.weight", (moe + "experts.{e}.w1.weight",
                  moe + "experts.{e}.w3.weight"), ((ffn, h), (ffn, h)), "expert", "rows"),
            Param(experts + "linear_fc2.weight", (moe + "experts.{e}.w2.weight",), ((h, ffn),),
                  "expert"),
        ]  # fmt: skip
    else:
        mlp = layer + "mlp."
        table += [
            Param(mega + "mlp.linear_fc1.weight", (mlp + "gate_proj.weight", mlp + "up_proj.weight"),
                  ((ffn, h), (ffn, h)), "layer", "rows"),
            Param(mega + "mlp.linear_fc2.weight", (mlp + "down_proj.weight",), ((h, ffn),), "layer"),
        ]  # fmt: skip
    return table


def to_megatron(param: Param, tensors: list[torch.Tensor], layout: Layout) -> torch.Tensor:
    if param.join == "qkv":
        per = layout.heads // layout.groups
        q, k, v = (t.reshape(layout.groups, -1, *t.shape[1:]) for t in tensors)
        assert q.shape[1] == per * layout.head_dim
        return torch.cat([q, k, v], dim=1).reshape(-1, *q.shape[2:])
    if param.join == "rows":
        return torch.cat(tensors)
    (tensor,) = tensors
    if param.join == "vocab" and layout.padded_vocab > layout.vocab:
        pad = tensor.new_zeros(layout.padded_vocab - layout.vocab, *tensor.shape[1:])
        return torch.cat([tensor, pad])
    return tensor


def to_hf(param: Param, tensor: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    if param.join == "qkv":
        d, per = layout.head_dim, layout.heads // layout.groups
        grouped = tensor.reshape(layout.groups, (per + 2) * d, *tensor.shape[1:])
        parts = grouped.split([per * d, d, d], dim=1)
        return [p.reshape(-1, *tensor.shape[1:]).contiguous() for p in parts]
    if param.join == "rows":
        return [t.contiguous() for t in tensor.chunk(2)]
    if param.join == "vocab":
        return [tensor[: layout.vocab].contiguous()]
    return [tensor.contiguous()]


def extra_state_keys(layout: Layout) -> list[tuple[str, str]]:
    """(key, scope) of the `_extra_state` objects Megatron's linear layers save (None each)."""
    return [
        (p.key.removesuffix(".weight") + "._extra_state", p.scope)
        for p in params(layout)
        if ".linear_" in p.key and p.key.endswith(".weight") and p.scope != "model"
    ]


def rank_offsets(index: tuple[int, ...], layout: Layout) -> list[tuple[int, int, int]]:
    counts = (layout.num_layers, layout.experts)
    return [(axis, i, counts[axis]) for axis, i in enumerate(index)]


def hf_config(layout: Layout, args: Any, dtype: torch.dtype) -> dict[str, Any]:
    """config.json for the Megatron model `args` describe."""
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    model_type = ("mixtral" if layout.experts else "qwen3" if layout.qk_norm
                  else "qwen2" if layout.qkv_bias else "llama")  # fmt: skip
    architecture = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "mixtral": "Mixtral"}
    config: dict[str, Any] = {
        "architectures": [f"{architecture[model_type]}ForCausalLM"],
        "model_type": model_type,
        "hidden_act": "silu",
        "hidden_size": layout.hidden,
        "intermediate_size": layout.ffn,
        "num_hidden_layers": layout.num_layers,
        "num_attention_heads": layout.heads,
        "num_key_value_heads": layout.groups,
        "head_dim": layout.head_dim,
        "vocab_size": layout.vocab,
        "max_position_embeddings": args.max_position_embeddings,
        "rms_norm_eps": args.layernorm_epsilon,
        "rope_theta": float(args.rotary_base),
        "tie_word_embeddings": layout.tied,
        "attention_bias": layout.qkv_bias,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if args.use_rope_scaling:
        fixed = RotaryEmbedding._apply_scaling.__defaults__  # factor first, then the fixed three
        names = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
        config["rope_scaling"] = {"rope_type": "llama3", "factor": float(args.rope_scaling_factor),
                                  **dict(zip(names, fixed[-3:], strict=True))}  # fmt: skip
    if model_type in ("qwen2", "qwen3"):
        config |= {"use_sliding_window": False, "sliding_window": None}
    if layout.experts:
        config |= {"num_local_experts": layout.experts, "num_experts_per_tok": args.moe_router_topk,
                   "router_aux_loss_coef": args.moe_aux_loss_coeff, "sliding_window": None}  # fmt: skip
    return config


def padded_vocab_size(args: Any, needed_for: str = "to import a Hugging Face model") -> int:
    """Megatron's padded vocabulary for these args (as the tokenizer would pad it); without a
    vocabulary size, a ConfigError saying what it is `needed_for`."""
    from megatron.core.tokenizers.utils.build_tokenizer import vocab_size_with_padding

    if args.padded_vocab_size:
        return int(args.padded_vocab_size)
    if not args.vocab_size:
        raise ConfigError(f"megatron: set vocab_size (the tokenizer's) {needed_for}")
    return int(vocab_size_with_padding(args.vocab_size, args, logging_enabled=False))
