"""What Megatron asserts of the model's shape, its parallel split and its precision, in
`validate_args` or only when it builds the model (TransformerConfig, the attention's reshape),
or when the first batch meets a context-parallel split: checked from the params over Megatron's
defaults, without importing Megatron."""

from __future__ import annotations

import argparse
from typing import Any

from primus.core.config import ModuleConfig

# What Megatron cannot build a model without (key -> the keys that may stand in for it)
REQUIRED: dict[str, tuple[str, ...]] = {
    "num_layers": ("encoder_num_layers", "hybrid_layer_pattern", "hybrid_override_pattern"),
    "hidden_size": (),
    "num_attention_heads": (),
    "max_position_embeddings": (),
    "seq_length": ("encoder_seq_length",),
}
VIRTUAL = ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank")


def last_set(config: ModuleConfig, *keys: str) -> str:
    """Which of `keys` was set by the latest layer (the CLI over the experiment over the
    presets); the first of them on a tie: the key to point at when two disagree."""
    layers = [config.tree.layer(config.origin(key)) for key in keys]
    return keys[layers.index(max(layers))]


def check_model(config: ModuleConfig, args: argparse.Namespace) -> None:
    """The model Megatron builds from `args` (`megatron_values`): every size it needs set, the
    sequence within the position embeddings, the virtual pipeline stages, one precision."""
    for key, alternatives in REQUIRED.items():
        if all(getattr(args, k) is None for k in (key, *alternatives)):
            raise config.error(
                key, f"{key} is not set: Megatron has no default for it",
                hint=f"set {key} (a model: preset sets it)",
            )  # fmt: skip
    length = args.seq_length if args.seq_length is not None else args.encoder_seq_length
    if length > args.max_position_embeddings:
        raise config.error(
            last_set(config, "seq_length", "max_position_embeddings"),
            f"seq_length ({length}) is above max_position_embeddings "
            f"({args.max_position_embeddings}): Megatron needs the sequence within them",
            hint=f"set seq_length to at most {args.max_position_embeddings}, or "
            f"set max_position_embeddings to at least {length}",
        )
    _check_virtual_pipeline(config, args)
    if args.fp16 and args.bf16:
        raise config.error(
            last_set(config, "bf16", "fp16"),
            "fp16 and bf16 are both true: Megatron trains in one of them",
            hint="set bf16: false to train in fp16, or set fp16: false to train in bf16",
        )


def _check_virtual_pipeline(config: ModuleConfig, args: argparse.Namespace) -> None:
    """Megatron's interleaved schedule (more than one virtual stage per pipeline rank) needs
    more than one pipeline stage (two without overlapped p2p communication). Left to
    `validate_args` where a layout, a hybrid pattern or uneven stages decide the split."""
    chosen = [key for key in VIRTUAL if getattr(args, key) is not None]
    hybrid = args.hybrid_layer_pattern or args.hybrid_override_pattern
    if not chosen or args.pipeline_model_parallel_layout or hybrid:
        return
    if len(chosen) > 1:
        later = last_set(config, *chosen)
        raise config.error(
            later,
            f"{' and '.join(chosen)} are both set: Megatron takes one of them",
            hint=f"set {later}: null",
        )
    key, pipeline = chosen[0], args.pipeline_model_parallel_size
    stages = args.num_virtual_stages_per_pipeline_rank
    if stages is None:
        if args.decoder_first_pipeline_num_layers or args.decoder_last_pipeline_num_layers:
            return
        layers = (
            (args.num_layers or args.encoder_num_layers)
            + args.account_for_embedding_in_pipeline_split
            + args.account_for_loss_in_pipeline_split
        )
        if layers % pipeline:  # uneven stages: validate_args says so
            return
        per_stage, per_virtual = layers // pipeline, args.num_layers_per_virtual_pipeline_stage
        if per_stage % per_virtual:
            raise config.error(
                key,
                f"{key} ({per_virtual}) must divide the {per_stage} layers of each pipeline stage",
                hint=f"set {key} to a divisor of {per_stage}",
            )
        stages = per_stage // per_virtual
    least = 2 if args.overlap_p2p_comm else 3
    if stages > 1 and pipeline < least:
        raise config.error(
            key,
            f"{key} {getattr(args, key)} makes {stages} virtual stages per pipeline rank: "
            f"Megatron's interleaved schedule needs pipeline_model_parallel_size {least} or more "
            f"(it is {pipeline})",
            hint=f"set {key}: null, or set pipeline_model_parallel_size to {least} or more",
        )


def check_sizes(config: ModuleConfig, defaults: dict[str, Any]) -> None:
    """The divisibility Megatron asserts in validate_args, or only when it builds the model
    (TransformerConfig, the attention's reshape), or when the first batch meets a
    context-parallel split."""
    value: dict[str, Any] = {k: config.params.get(k, defaults.get(k)) for k in defaults}
    if value["kv_channels"] is None:
        config.require_divisor("hidden_size", "num_attention_heads",
                               "each head gets hidden_size / num_attention_heads", defaults)  # fmt: skip
    built = "Megatron refuses it when it builds the model"
    config.require_divisor("num_attention_heads", "tensor_model_parallel_size", built, defaults)
    groups, tp = value["num_query_groups"], value["tensor_model_parallel_size"]
    if value["group_query_attention"]:  # the attention reshapes the heads into equal groups
        why = "each group shares one key-value head among the same number of query heads"
        config.require_divisor("num_attention_heads", "num_query_groups", why, defaults)
    split = isinstance(groups, int) and isinstance(tp, int) and groups > 0 and tp > 0
    if value["group_query_attention"] and split and groups % tp and tp % groups:
        raise config.error(
            "tensor_model_parallel_size",
            f"num_query_groups ({groups}) must be a multiple or a divisor of "
            f"tensor_model_parallel_size ({tp}): {built}",
            hint=f"set tensor_model_parallel_size to a divisor or a multiple of {groups}",
        )
    simple_pipeline = not any(
        value[k] for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                           "account_for_embedding_in_pipeline_split",
                           "account_for_loss_in_pipeline_split", "hybrid_layer_pattern",
                           "hybrid_override_pattern", "pipeline_model_parallel_layout")
    )  # fmt: skip
    if simple_pipeline:
        config.require_divisor("num_layers", "pipeline_model_parallel_size",
                               "each pipeline stage gets as many layers", defaults)  # fmt: skip
    context, length = value["context_parallel_size"], value["seq_length"]
    if (
        isinstance(context, int)
        and isinstance(length, int)
        and context > 1
        and length % (2 * context)
    ):
        raise config.error(
            "context_parallel_size",
            f"2 x context_parallel_size ({context}) must divide seq_length ({length}): "
            "each rank gets two chunks of the sequence",
            hint="set context_parallel_size so that twice it divides seq_length",
        )
