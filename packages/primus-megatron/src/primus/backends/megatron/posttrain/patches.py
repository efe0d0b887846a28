"""Fine-tuning (`primus train posttrain`): the Megatron args the module's `sft:`/`peft:` imply."""

from __future__ import annotations

from primus.core.errors import ConfigError
from primus.core.patches import PatchContext, get_param, register_patch


def _posttrain(ctx: PatchContext) -> bool:
    """the stage is posttrain"""
    return ctx.stage == "posttrain"


def _check_supported(ctx: PatchContext) -> None:
    """What Primus's fine-tuning on Megatron does not cover, refused before anything runs."""
    module = ctx.extra["module"]
    # after megatron.local_layers_without_te, which sets local when TE is not installed
    te = get_param(ctx, "transformer_impl", "transformer_engine") == "transformer_engine"
    if module.sft.packing and te:
        raise module.sft.error(
            "packing",
            "megatron: sft.packing masks attention per document in Megatron's local attention "
            "only, not with transformer_impl: transformer_engine",
            hint="set transformer_impl: local, or sft.packing: false",
        )
    if module.peft is None:
        return
    problems = {
        "tensor_model_parallel_size": get_param(ctx, "tensor_model_parallel_size", 1) != 1,
        "num_experts": bool(get_param(ctx, "num_experts")),
        "transformer_impl": te,
    }
    for key, bad in problems.items():
        if bad:
            raise module.peft.error(
                "type",
                f"megatron: LoRA is not supported with {key}: {get_param(ctx, key)}",
                hint="Primus's Megatron LoRA covers dense models, tensor parallel 1, "
                "Megatron's local layers (docs/posttrain.md)",
            )


@register_patch(
    "megatron.posttrain",
    backend="megatron",
    phase="setup",
    condition=_posttrain,
    target="megatron args: seq_length, tokenizer_type, tokenizer_model, "
    "calculate_per_token_loss, create_attention_mask_in_dataloader",
    tags=("posttrain",),
)
def posttrain(ctx: PatchContext) -> None:
    """Fine-tune on the module's `sft:` rows: its sequence length and tokenizer, the loss as
    one masked mean over the global batch, a per-row attention mask when packing."""
    module = ctx.extra["module"]
    if module.sft is None:
        raise ConfigError(
            "megatron: the posttrain stage needs the module's sft: section (the data)",
            hint="see docs/posttrain.md",
        )
    _check_supported(ctx)
    sft = module.sft
    ctx.set_param("seq_length", sft.seq_length, "sft.seq_length")
    ctx.set_param("tokenizer_type", "HuggingFaceTokenizer", "sft.tokenizer")
    ctx.set_param("tokenizer_model", str(sft.tokenizer), "sft.tokenizer")
    ctx.set_param(
        "calculate_per_token_loss", True, "the loss is one masked mean over the global batch"
    )
    ctx.set_param(
        "create_attention_mask_in_dataloader",
        sft.packing,
        "packed rows need a per-row block-diagonal causal mask" if sft.packing
        else "unpacked rows use the causal mask",
    )  # fmt: skip
