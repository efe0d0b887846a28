"""What Megatron takes on trust, refuses only when it builds the model or its scheduler, or
cannot be told with null: checked from the params over Megatron's defaults (its schema),
without importing Megatron (the model's shape in `model_checks`, the schedule in
`schedule_checks`). Every run and `config validate` run these before anything else of the
backend; `check_sequence_parallel` needs the norm class in place, after the patches."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from primus.backends.megatron.config.model_checks import check_model, check_sizes
from primus.backends.megatron.config.schedule_checks import check_schedule
from primus.core.config import ModuleConfig, ParamSchema
from primus.core.config.sanity import (
    FRACTION,
    LEARNING_RATE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Rule,
    Rules,
    is_number,
)
from primus.core.projection import Model


def _is_blend(value: Any) -> bool:
    """Megatron's dataset blend: a path, paths, or weight-path pairs (`[0.3, a, 0.7, b]`)."""
    items = value if isinstance(value, list) else [value]
    if all(isinstance(item, str) and item for item in items):
        return bool(items)
    return (
        len(items) % 2 == 0
        and all(is_number(w) and w >= 0 for w in items[::2])
        and all(isinstance(p, str) and p for p in items[1::2])
    )


BLEND = Rule(
    "a path, a list of paths, or weight-path pairs (0.3, a, 0.7, b)",
    _is_blend,
    refuses=([0.5, "a", 0.5],),
)
# What Megatron takes on trust and fails on later (or trains nothing): refused at validation.
RULES: Rules = {
    **dict.fromkeys(
        (
            "micro_batch_size", "global_batch_size", "train_iters", "train_samples", "seq_length",
            "max_position_embeddings", "num_layers", "hidden_size", "ffn_hidden_size",
            "num_attention_heads", "num_query_groups", "kv_channels", "vocab_size",
            "tensor_model_parallel_size", "pipeline_model_parallel_size",
            "context_parallel_size", "expert_model_parallel_size", "log_interval",
            "eval_interval", "save_interval", "lr_decay_iters", "lr_decay_samples",
            "make_vocab_size_divisible_by", "num_layers_per_virtual_pipeline_stage",
            "num_virtual_stages_per_pipeline_rank",
            "seed",  # Megatron's set_random_seed refuses 0 too
        ),
        POSITIVE,
    ),
    # 0 turns each off (no warm-up, clipping, evaluation; num_experts 0: a dense model)
    **dict.fromkeys(
        ("lr_warmup_iters", "lr_warmup_samples", "lr_warmup_init", "clip_grad", "eval_iters",
         "num_experts"),
        NON_NEGATIVE,
    ),
    **dict.fromkeys(("hidden_dropout", "attention_dropout"), UNIT),  # torch.nn.Dropout's range
    "lr": LEARNING_RATE,
    "min_lr": LEARNING_RATE,
    "adam_beta1": FRACTION,
    "adam_beta2": FRACTION,
    "adam_eps": NON_NEGATIVE,
    "weight_decay": NON_NEGATIVE,
    **dict.fromkeys(("data_path", "train_data_path", "valid_data_path", "test_data_path"), BLEND),
}  # fmt: skip


def norm_undecided(values: Any) -> str | None:
    """Why splitting the sequence over tensor-parallel ranks needs the norm class in place (a
    patch may replace Megatron's) to be judged; None when it does not (`values`: the args, or
    the params over Megatron's defaults)."""
    size = values.tensor_model_parallel_size
    local = values.transformer_impl == "local" or not _installed("transformer_engine")
    if values.sequence_parallel and size > 1 and local and not _installed("apex"):
        return "sequence_parallel with the local norm: the norm class in place decides"
    return None


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_sequence_parallel(config: ModuleConfig, args: argparse.Namespace) -> None:
    """What Megatron rejects only when it builds the model: sequence parallel with a norm that
    cannot split the sequence (the norm class in place, patches applied, says which can)."""
    from megatron.core.transformer import torch_norm

    local_norm = args.transformer_impl == "local" and not _installed("apex")
    # the norm class in place (a patch may have replaced it) says which norms it can split
    splits = getattr(torch_norm.WrappedTorchNorm, "sequence_parallel_normalizations", ())
    if args.sequence_parallel and local_norm and args.normalization not in splits:
        reason = (
            f"the norm in place splits only {', '.join(splits)}, not {args.normalization}"
            if splits
            else "transformer_impl local without Apex builds the torch norm, which Megatron "
            "refuses to split"
        )
        raise config.error(
            "sequence_parallel",
            f"sequence_parallel needs a norm that splits the sequence: {reason}",
            hint="set sequence_parallel: false (or turbo.enable: true with normalization: "
            "RMSNorm, or install Apex, or Transformer Engine with transformer_impl: "
            "transformer_engine)",
        )


def check_params(config: ModuleConfig, schema: ParamSchema, own: frozenset[str]) -> str | None:
    """Megatron's params (`own`: the schema's keys that are Megatron's) checked without Megatron:
    no null where Megatron has a default, the RULES, the learning-rate schedule. Returns why the
    full check must decide (`norm_undecided`), or None."""
    params = {k: v for k, v in config.params.items() if k in own}
    for key, value in params.items():
        default = schema.specs[key].default
        if value is None and default is not None:  # Megatron's command line cannot unset it
            raise config.error(
                key, f"{key} cannot be null: Megatron's default for it is {default!r}",
                hint=f"remove {key} to keep Megatron's default, or set a value",
            )  # fmt: skip
    config.require(RULES)
    check_sizes(config, {k: schema.specs[k].default for k in own})
    args = megatron_values(config, schema, own)
    check_model(config, args)
    check_batch(config, args)
    check_schedule(config, args)
    _check_document_masks(config, args)
    _check_finetuning(config, args)
    return norm_undecided(args)


def _check_document_masks(config: ModuleConfig, args: argparse.Namespace) -> None:
    """`reset_attention_mask` keeps attention within each document only through the mask the
    data loader makes (fine-tuning sets that itself): without it, silently, it would not."""
    if (
        config.sft is None
        and args.reset_attention_mask
        and not args.create_attention_mask_in_dataloader
    ):
        raise config.error(
            "reset_attention_mask",
            "reset_attention_mask needs the data loader's attention mask "
            "(create_attention_mask_in_dataloader is false)",
            hint="set create_attention_mask_in_dataloader: true with it (or set "
            "reset_attention_mask: false)",
        )


def _check_dpo(config: ModuleConfig, args: argparse.Namespace) -> None:
    """What Primus's DPO on Megatron does not cover: a reference other than the HF import; the
    forward step runs the policy and the reference on whole rows of one pipeline stage, and
    takes the model's output for the per-token cross-entropy alone."""
    if config.dpo is None:
        return
    if config.init_from is None and not args.load:
        raise config.dpo.error(
            "",
            "megatron: dpo needs the run's initial weights as its reference, and the module "
            "starts from none",
            hint="set init_from: {hf: DIR} (or load: a checkpoint folder holding the HF import)",
        )
    problems = {
        "pipeline_model_parallel_size": args.pipeline_model_parallel_size != 1,
        "context_parallel_size": args.context_parallel_size != 1,
        "num_experts": bool(args.num_experts),
        "mtp_num_layers": bool(args.mtp_num_layers),
    }
    for key, bad in problems.items():
        if bad:
            raise config.error(
                key,
                f"megatron: dpo is not supported with {key}: {getattr(args, key)}",
                hint="Primus's Megatron DPO covers dense models without multi-token "
                "prediction, pipeline and context parallel 1",
            )


def _check_finetuning(config: ModuleConfig, args: argparse.Namespace) -> None:
    """What Primus's fine-tuning on Megatron does not cover (`sft:` packing, `peft:`, `dpo:`)."""
    _check_dpo(config, args)
    # megatron.local_layers_without_te builds local layers where TE is not installed
    te = args.transformer_impl == "transformer_engine" and _installed("transformer_engine")
    if config.sft is not None and config.sft.packing and te:
        raise config.sft.error(
            "packing",
            "megatron: sft.packing masks attention per document in Megatron's local attention "
            "only, not with transformer_impl: transformer_engine",
            hint="set transformer_impl: local, or sft.packing: false",
        )
    virtual = (
        args.num_layers_per_virtual_pipeline_stage or args.num_virtual_stages_per_pipeline_rank
    )
    if (
        config.sft is not None
        and config.sft.packing
        and (
            args.pipeline_model_parallel_size > 2
            or (args.pipeline_model_parallel_size > 1 and virtual)
        )
    ):
        raise config.sft.error(
            "packing",
            "megatron: sft.packing with pipeline stages between the first and the last "
            f"(pipeline_model_parallel_size {args.pipeline_model_parallel_size}"
            f"{', virtual stages' if virtual else ''}): those read no rows, so their "
            "attention would not get the rows' document mask",
            hint="set pipeline_model_parallel_size to 2 at most (no virtual stages), or "
            "sft.packing: false",
        )
    if config.peft is None:
        return
    problems = {
        "num_experts": bool(args.num_experts),
        "transformer_impl": te,
        "sequence_parallel": args.sequence_parallel and args.tensor_model_parallel_size > 1,
    }
    for key, bad in problems.items():
        if bad:
            raise config.peft.error(
                "type",
                f"megatron: LoRA is not supported with {key}: {getattr(args, key)}",
                hint="Primus's Megatron LoRA covers dense models, Megatron's local layers, "
                "tensor parallel without sequence parallel (docs/posttrain.md)",
            )


def check_batch(config: ModuleConfig, args: argparse.Namespace, data_parallel: int = 1) -> None:
    """The global batch splits into micro-batches over `data_parallel` ranks (`args`:
    `megatron_values`), as Megatron asserts once every rank has imported it; with the default
    of 1, what holds for any number of processes."""
    total, micro = args.global_batch_size, args.micro_batch_size
    if total is None or args.rampup_batch_size or total % (micro * data_parallel) == 0:
        return
    ranks = f" over {data_parallel} data-parallel ranks" if data_parallel > 1 else ""
    raise config.error(
        "global_batch_size",
        f"global_batch_size {total} cannot be split into micro-batches of {micro} "
        f"(micro_batch_size){ranks}",
        hint=f"set global_batch_size to a multiple of {micro * data_parallel}",
    )


def megatron_values(
    config: ModuleConfig, schema: ParamSchema, own: frozenset[str]
) -> argparse.Namespace:
    """Megatron's args as the params over Megatron's defaults, before `validate_args` (which
    derives more)."""
    params = {k: v for k, v in config.params.items() if k in own}
    return argparse.Namespace(**{k: schema.specs[k].default for k in own} | params)


def checkpoint_bytes(args: argparse.Namespace, lora: bool) -> int | None:
    """About the bytes of one checkpoint of the run `args` describe (`megatron_values`): every
    weight, and (unless `lora` freezes them, or no_save_optim) the optimizer state: an fp32 main
    copy under mixed precision and Adam's two moments. None when the run saves none, or its
    vocabulary comes from the tokenizer."""
    sizes = (args.num_layers, args.hidden_size, args.num_attention_heads, args.vocab_size)
    if not args.save_interval or not all(isinstance(size, int) for size in sizes):
        return None
    heads = args.num_attention_heads
    divisor = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
    model = Model(
        layers=args.num_layers,
        hidden=args.hidden_size,
        heads=heads,
        kv_heads=args.num_query_groups if args.group_query_attention else heads,
        head_dim=args.kv_channels or args.hidden_size // heads,
        ffn=args.moe_ffn_hidden_size
        if args.num_experts
        else (args.ffn_hidden_size or 4 * args.hidden_size),
        vocab=-(-args.vocab_size // divisor) * divisor,
        tied=not args.untie_embeddings_and_output_weights,
        gated=bool(args.swiglu),
        qkv_bias=bool(args.add_qkv_bias or args.add_bias_linear),
        qk_norm=bool(args.qk_layernorm),
        experts=args.num_experts or 0,
    )
    mixed = bool(args.bf16 or args.fp16)
    weight = 2 if mixed else 4
    optimizer = 0 if args.no_save_optim or lora else 8 + 4 * mixed
    return model.parameters() * (weight + optimizer)
