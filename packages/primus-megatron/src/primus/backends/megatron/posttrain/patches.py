"""Fine-tuning (`primus train posttrain`): the Megatron args the module's `sft:`/`peft:` imply."""

from __future__ import annotations

from primus.core.patches import PatchContext, register_patch


def _posttrain(ctx: PatchContext) -> bool:
    """the stage is posttrain"""
    return ctx.stage == "posttrain"


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
    sft = ctx.extra["module"].require_sft()  # what it does not cover: refused by check_params
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
