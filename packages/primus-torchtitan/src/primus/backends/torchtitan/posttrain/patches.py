"""Fine-tuning (`primus train posttrain`): the TorchTitan params the module's `sft:` implies,
and LoRA checkpoints that hold the adapters only."""

from __future__ import annotations

from typing import Any

from primus.core.patches import TESTED, PatchContext, register_patch


def _posttrain(ctx: PatchContext) -> bool:
    """the stage is posttrain, or the module has an sft: section (its export)"""
    return ctx.stage == "posttrain" or ctx.extra["module"].sft is not None


@register_patch(
    "torchtitan.posttrain",
    backend="torchtitan",
    phase="setup",
    priority=40,  # before torchtitan.mock_data, which looks at dataloader.dataset
    condition=_posttrain,
    target="Trainer.Config: training.seq_len, hf_assets_path, dataloader.dataset, validator.enable",
    tags=("posttrain",),
)
def posttrain(ctx: PatchContext) -> None:
    """Fine-tune on the module's `sft:` rows: its sequence length and tokenizer; the eval split
    evaluated every validator.freq steps."""
    module = ctx.extra["module"]
    sft = module.require_sft()
    evaluates = sft.eval is not None or sft.eval_fraction > 0  # the rest: check_finetuning
    ctx.set_param("training.seq_len", sft.seq_length, "sft.seq_length")
    ctx.set_param("hf_assets_path", str(sft.tokenizer), "sft.tokenizer (the export carries it)")
    ctx.set_param("dataloader.dataset", "sft", "the rows of the module's sft: section")
    ctx.set_param("validator.enable", evaluates,
                  "the eval split of sft:" if evaluates else "sft: has no eval split")  # fmt: skip


def _lora(ctx: PatchContext) -> bool:
    """the stage is posttrain, with a peft: section"""
    return ctx.stage == "posttrain" and ctx.extra["module"].peft is not None


@register_patch(
    "torchtitan.lora_checkpoint",
    backend="torchtitan",
    phase="build_args",
    condition=_lora,
    backend_versions=TESTED,
    target="torchtitan.components.checkpointer.base.ModelWrapper._get_state_dict",
    tags=("posttrain",),
)
def lora_checkpoint(ctx: PatchContext) -> None:
    """The model's part of TorchTitan's checkpoints is the LoRA adapters only: the frozen
    weights stay the HF import's (Primus loads them from there, also on resume)."""
    from primus.backends.torchtitan.posttrain.lora import is_adapter

    def adapters_only(original: Any) -> Any:
        def state(self: Any) -> dict[str, Any]:
            return {k: v for k, v in original(self).items() if is_adapter(k)}

        return state

    ctx.wrap("torchtitan.components.checkpointer.base.ModelWrapper", "_get_state_dict",
             adapters_only)  # fmt: skip


@register_patch(
    "torchtitan.lora_keeps_frozen",
    backend="torchtitan",
    phase="build_args",
    condition=_lora,
    backend_versions=TESTED,
    target="torchtitan.protocols.module.Module._spmd_distribute_state",
    tags=("posttrain",),
)
def lora_keeps_frozen(ctx: PatchContext) -> None:
    """Frozen weights stay frozen: with parallelism.spmd_backend spmd_types (TorchTitan's
    default), distributing a parameter registers a new `nn.Parameter(tensor)`, which needs a
    gradient, so LoRA's frozen base weights would train. The new parameter keeps the old one's
    `requires_grad`."""

    def keep_requires_grad(original: Any) -> Any:
        def distribute(self: Any, parallel_dims: Any, name: str, tensor: Any, layout: Any,
                       *, is_param: bool) -> None:  # fmt: skip
            trainable = self._parameters[name].requires_grad if is_param else None
            original(self, parallel_dims, name, tensor, layout, is_param=is_param)
            if trainable is not None:
                self._parameters[name].requires_grad_(trainable)

        return distribute

    ctx.wrap("torchtitan.protocols.module.Module", "_spmd_distribute_state", keep_requires_grad)
