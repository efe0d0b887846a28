"""Fine-tuning (`primus train posttrain`) through MaxText's own training loop.

`maxtext.posttrain` (setup) sets the MaxText keys the module's `sft:` implies; `maxtext.sft_data`
(before_train) feeds core's SFT rows to the loop and evaluates with core's token sums
(primus.backends.maxtext.posttrain.sft). With `peft:`, `maxtext.lora` (setup) turns on MaxText's
LoRA training and `maxtext.lora_model` (before_train) puts qwix's adapters on the model it
builds (primus.backends.maxtext.posttrain.lora).
"""

from __future__ import annotations

from typing import Any

from primus.backends.maxtext.data.rows import TRAIN, feed, loaded_batch
from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_param, register_patch


def _fine_tuning(ctx: PatchContext) -> bool:
    """the stage is posttrain, or the module has an sft: section (e.g. to export a fine-tune)"""
    return ctx.stage == "posttrain" or ctx.extra["module"].sft is not None


@register_patch(
    "maxtext.posttrain",
    backend="maxtext",
    phase="setup",
    condition=_fine_tuning,
    backend_versions=TESTED,
    target="MaxText config max_target_length, tokenizer_path, tokenizer_type, dataset_type, "
    "packing, eval_start_step",
    tags=("posttrain",),
)
def posttrain(ctx: PatchContext) -> None:
    """Fine-tune on the module's `sft:` rows: their sequence length and tokenizer (which an
    export copies), MaxText's data pipeline off, evals after every eval_interval-th step."""
    sft = ctx.extra["module"].require_sft()
    ctx.set_param("tokenizer_path", str(sft.tokenizer), "sft.tokenizer")
    ctx.set_param("tokenizer_type", "huggingface", "sft.tokenizer is an HF tokenizer")
    if ctx.stage != "posttrain":
        return
    ctx.set_param("max_target_length", sft.seq_length, "sft.seq_length")
    ctx.set_param("dataset_type", "synthetic", "the batches are sft:'s rows (maxtext.sft_data)")
    ctx.set_param("packing", False, "sft: packs the rows itself (sft.packing)")
    interval = get_param(ctx, "eval_interval", -1)
    if sft.eval is None and not sft.eval_fraction:
        ctx.set_param("eval_interval", -1, "sft: has no eval split")
    elif interval > 0:
        ctx.set_param("eval_start_step", interval - 1, "evals after steps eval_interval, 2x, ...")


def _eval_sums(original: Any) -> Any:
    """MetricLogger._accumulate_eval_metrics, adding up the eval step's correct predictions."""

    def accumulate(self: Any, metrics: dict[str, Any]) -> None:
        original(self, metrics)
        correct = metrics.get("scalar", {}).get("evaluation/primus_correct")
        if correct is not None:
            self.cumulative_eval_metrics["scalar"]["eval/primus_correct"] += float(correct)

    return accumulate


def _posttrain_stage(ctx: PatchContext) -> bool:
    """the stage is posttrain"""
    return ctx.stage == "posttrain"


@register_patch(
    "maxtext.sft_data",
    backend="maxtext",
    phase="before_train",
    condition=_posttrain_stage,
    requires="maxtext.posttrain",
    backend_versions=TESTED,
    target="maxtext.input_pipeline.input_pipeline_interface.create_data_iterator, "
    "maxtext.trainers.pre_train.train.eval_step, get_first_step, "
    "maxtext.common.metric_logger.MetricLogger._accumulate_eval_metrics",
    tags=("posttrain",),
)
def sft_data(ctx: PatchContext) -> None:
    """MaxText's training loop reads the SFT rows by global position (each process its share
    of every global batch, a resumed run from its step) and evaluates one pass over the eval
    rows with core's token sums (loss and token accuracy)."""
    import jax

    from primus.backends.maxtext.posttrain import sft
    from primus.core.posttrain import build_sft_data

    trainer = ctx.extra["trainer"]
    config = trainer.config
    batch = loaded_batch(config, "fine-tuning")
    data = build_sft_data(ctx.extra["module"].sft)
    log_rank_0(f"[maxtext] sft train: {data.train.describe()}")
    where = (jax.process_index(), jax.process_count())
    train = sft.TrainRows(data.train, batch, *where)
    evaluation = None
    if data.eval is not None and config.eval_interval > 0:
        log_rank_0(f"[maxtext] sft eval: {data.eval.describe()}")
        evaluation = sft.EvalRows(data.eval, config.global_batch_size_to_load_eval, *where)

    feed(ctx, train, evaluation)
    ctx.replace(TRAIN, "eval_step", sft.eval_step)
    ctx.wrap("maxtext.common.metric_logger.MetricLogger", "_accumulate_eval_metrics", _eval_sums)
    trainer.sft_rows = train


def _lora(ctx: PatchContext) -> bool:
    """the module has a peft: section"""
    return ctx.extra["module"].peft is not None


@register_patch(
    "maxtext.lora",
    backend="maxtext",
    phase="setup",
    condition=_lora,
    backend_versions=TESTED,
    target="MaxText config lora (enable_lora, lora_rank, lora_alpha, lora_module_path)",
    tags=("posttrain",),
)
def lora_config(ctx: PatchContext) -> None:
    """MaxText's LoRA training from `peft:`: its optimizer and train step take the
    `nnx.LoRAParam`s only, its checkpoints hold them (and their optimizer state) only."""
    from primus.backends.maxtext.posttrain.lora import maxtext_lora

    peft = ctx.extra["module"].peft
    ctx.set_param("lora", maxtext_lora(peft), f"peft: LoRA on {', '.join(peft.target_modules)}")


def _lora_training(ctx: PatchContext) -> bool:
    """the stage is posttrain and the module has a peft: section"""
    return _posttrain_stage(ctx) and _lora(ctx)


@register_patch(
    "maxtext.lora_model",
    backend="maxtext",
    phase="before_train",
    condition=_lora_training,
    requires="maxtext.lora",
    backend_versions=TESTED,
    target="maxtext.utils.model_creation_utils.get_nnx_create_model_fn, "
    "maxtext.common.checkpointing.load_state_if_possible, _filter_lora_trainable_state",
    tags=("posttrain",),
)
def lora_model(ctx: PatchContext) -> None:
    """The model MaxText's loop builds gets qwix's LoRA adapters (MaxText applies them only in
    its Tunix trainer), drawn or from the PEFT adapter `init_from.adapter`; a resumed run loads its frozen weights from the HF import as a fresh
    run does (MaxText's restore of a LoRA checkpoint reads the adapters alone); checkpoints
    keep the optimizer's state (MaxText's LoRA filter drops it: it keeps dict entries whose
    path names "lora", and optax's state is tuples), so a resume continues exactly."""
    from primus.backends.maxtext.posttrain import lora

    module = ctx.extra["module"]
    peft = module.peft
    log_rank_0(f"[maxtext] LoRA: {lora.describe(peft)}")
    start = None
    if peft.adapter is not None:
        from primus.backends.maxtext.checkpoint.lora import peft_start

        start = peft_start(ctx.extra["trainer"].config, module.init_from, peft.adapter)

    def create_model_fn(original: Any) -> Any:
        def create(config: Any, mesh: Any = None, *args: Any, **kwargs: Any) -> Any:
            build = original(config, mesh, *args, **kwargs)
            return lambda: lora.apply(build(), mesh, config, start)

        return create

    def load_state(original: Any) -> Any:
        def load(manager: Any, iterator: Any, params_path: str, *args: Any, **kwargs: Any) -> Any:
            restored, params = original(manager, iterator, params_path, *args, **kwargs)
            if restored is not None and params is None and params_path:
                log_rank_0(f"[maxtext] LoRA: the frozen weights from {params_path}")
                _, params = original(None, iterator, params_path, *args, **kwargs)
            return restored, params

        return load

    def keep_optimizer(original: Any) -> Any:
        def filtered(state: Any) -> Any:
            kept = original(state)
            if isinstance(state, dict) and isinstance(kept, dict) and "opt_state" in state:
                kept["opt_state"] = state["opt_state"]  # the adapters' alone (wrt LoRAParam)
            return kept

        return filtered

    checkpointing = "maxtext.common.checkpointing"
    ctx.wrap("maxtext.utils.model_creation_utils", "get_nnx_create_model_fn", create_model_fn)
    ctx.wrap(checkpointing, "load_state_if_possible", load_state)
    ctx.wrap(checkpointing, "_filter_lora_trainable_state", keep_optimizer)
