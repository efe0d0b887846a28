"""Fine-tuning (`primus train posttrain`) through MaxText's own training loop.

`maxtext.posttrain` (setup) sets the MaxText keys the module's `sft:` implies (core refuses
`peft:`: MaxText does not declare the lora capability); `maxtext.sft_data` (before_train) feeds
core's SFT rows to the loop and evaluates with core's token sums
(primus.backends.maxtext.posttrain.sft).
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
