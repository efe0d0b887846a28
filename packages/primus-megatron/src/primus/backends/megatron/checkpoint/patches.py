"""Crash-safe resume: Megatron loads the latest complete checkpoint, whatever a kill during a
save left, and the log says which; a checkpoint of another model or other LoRA targets, or
one whose files are damaged, is one error naming it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.core.errors import ConfigError
from primus.core.logging import get_logger, log_rank_0
from primus.core.patches import TESTED, PatchContext, get_param, register_patch


def _latest_complete(original: Callable) -> Callable:
    def read_metadata(tracker_filename: str) -> tuple[int, bool]:
        from primus.backends.megatron.checkpoint.native import complete_iterations

        tracker = Path(tracker_filename)
        named = tracker.read_text().strip()
        complete = complete_iterations(tracker.parent)
        if named == "release" or (named.isdigit() and int(named) in complete):
            return original(tracker_filename)
        latest = complete[-1] if complete else -1
        get_logger().warning(
            f"[megatron] {tracker} names {named or 'nothing'!r}, not a complete checkpoint (a "
            "save was interrupted): "
            + (f"loading iteration {latest}, the latest complete one" if complete else
               "no complete checkpoint, training starts from scratch")
        )  # fmt: skip
        return latest, False

    return read_metadata


# the args whose change makes a checkpoint another model's (resharding or another vocabulary
# padding is Megatron's to handle)
ARCHITECTURE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "kv_channels", "num_experts")  # fmt: skip


def _same_model(module: Any, load: str) -> None:
    """A ConfigError where the latest complete checkpoint in `load` was saved by a model of
    another architecture (Megatron would fail on the first tensor's shape, with a traceback)."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict
    from megatron.training import get_args
    from primus.backends.megatron.checkpoint.native import complete_iterations
    from primus.core.checkpoint.dcp import numbered

    complete = complete_iterations(Path(load)) if Path(load).is_dir() else []
    if not complete:
        return
    folder = numbered(Path(load), "iter_")[complete[-1]]
    saved, args = load_common_state_dict(str(folder)).get("args"), get_args()
    for key in ARCHITECTURE:
        theirs, ours = getattr(saved, key, None), getattr(args, key, None)
        if theirs is not None and ours is not None and theirs != ours:
            raise module.error(
                key,
                f"the checkpoint {folder} holds a model with {key} {theirs}, this run's {ours}",
                hint="resume with the model it was saved with, or train another run "
                "(another exp_name)",
            )


def _loading(load: str) -> Path:
    """The checkpoint a resume from `load` reads: the tracker's when it is complete, else the
    latest complete one (the folder itself when there is none)."""
    from primus.backends.megatron.checkpoint.native import TRACKER, complete_iterations
    from primus.core.checkpoint.dcp import numbered

    folders, complete = numbered(Path(load), "iter_"), complete_iterations(Path(load))
    tracker = Path(load) / TRACKER
    named = tracker.read_text().strip() if tracker.is_file() else ""
    latest = max(complete, default=-1)
    return folders.get(int(named) if named.isdigit() and int(named) in complete else latest,
                       Path(load))  # fmt: skip


def _missing(exc: BaseException) -> str | None:
    """The tensor this run loads that the checkpoint lacks, where that is why DCP's load failed
    (Megatron's shape check raises a KeyError for it), or None."""
    from primus.core.errors import linked

    for cause in linked(exc):
        said = str(cause.args[0]) if isinstance(cause, KeyError) and cause.args else ""
        if " from model not in state dict" in said:
            return said.split(" from model not in state dict")[0]
    return None


def _say_which(module: Any) -> Callable[[Callable], Callable]:
    def wrapper(original: Callable) -> Callable:
        def load_checkpoint(*args: Any, **kwargs: Any) -> Any:
            from torch.distributed.checkpoint.api import CheckpointException

            from megatron.training import get_args
            from megatron.training.checkpointing import get_checkpoint_name
            from primus.core.checkpoint.dcp import damage, damaged, read_metadata

            load = get_args().load
            if load:
                read_metadata(_loading(load))  # a damaged one is refused before DCP logs it
            try:
                if load:
                    _same_model(module, load)
                iteration, flops = original(*args, **kwargs)
            except (Exception, CheckpointException) as exc:  # the latter is a BaseException
                if load and (cause := damage(exc)) is not None:
                    raise damaged(_loading(load), cause) from exc
                if load and (missing := _missing(exc)) is not None:
                    raise ConfigError(
                        f"the checkpoint {_loading(load)} holds no {missing}: it was saved by "
                        "another model, or with other LoRA targets (peft.target_modules)",
                        hint="resume with the settings it was saved with, or train another "
                        "run (another exp_name)",
                    ) from None
                raise
            if iteration and load:
                where = get_checkpoint_name(load, iteration, return_base_dir=True)
                log_rank_0(f"[megatron] resumed from {where} (iteration {iteration})")
            return iteration, flops

        return load_checkpoint

    return wrapper


def _torch_dist(ctx: PatchContext) -> bool:
    """ckpt_format is torch_dist (Megatron's default)"""
    return get_param(ctx, "ckpt_format", "torch_dist") == "torch_dist"


@register_patch(
    "megatron.latest_complete_checkpoint",
    backend="megatron",
    phase="before_train",
    condition=_torch_dist,
    backend_versions=TESTED,
    target="megatron.training.checkpointing.read_metadata, load_checkpoint",
    tags=("reliability",),
)
def latest_complete_checkpoint(ctx: PatchContext) -> None:
    """Resume from the latest complete checkpoint when the tracker file names none (a kill
    while Megatron wrote it leaves it empty, and Megatron then exits 0 without training) or an
    incomplete one; refuse one of another model (exit 2 naming the key, not a shape
    traceback) and say which one is damaged where its files cannot be read; log the
    checkpoint a run resumes from."""
    checkpointing = "megatron.training.checkpointing"
    ctx.wrap(checkpointing, "read_metadata", _latest_complete)
    ctx.wrap(checkpointing, "load_checkpoint", _say_which(ctx.extra["module"]))


# Megatron's names for the schedule values a checkpoint must match -> the params that set each
SCHEDULE_PARAMS = {
    "learning rate": ("lr",),
    "minimum learning rate": ("min_lr",),
    "warmup iterations": ("lr_warmup_iters", "lr_warmup_samples", "lr_warmup_fraction"),
    "total number of iterations": ("lr_decay_iters", "lr_decay_samples", "train_iters"),
    "learning rate decay style": ("lr_decay_style",),
    "start weight decay": ("start_weight_decay", "weight_decay"),
    "end weight decay": ("end_weight_decay", "weight_decay"),
    "total number of weight decay iterations": ("train_iters", "train_samples"),
    "weight decay incr style": ("weight_decay_incr_style",),
}


def _schedule_error(ctx: PatchContext) -> Callable[[Callable], Callable]:
    module = ctx.extra["module"]

    def wrapper(original: Callable) -> Callable:
        def check_and_set(scheduler: Any, cls_value: Any, sd_value: Any, name: str) -> Any:
            try:
                return original(scheduler, cls_value, sd_value, name)
            except AssertionError:
                from megatron.training import get_args

                keys = SCHEDULE_PARAMS.get(name, ("lr",))
                key = next((k for k in keys if module.origin(k)), keys[-1])  # the one set
                args = get_args()
                if "iterations" in name and args.train_iters:  # Megatron counts samples
                    sd_value, cls_value = (
                        v // args.global_batch_size for v in (sd_value, cls_value)
                    )
                raise module.error(
                    key,
                    f"the checkpoint's learning-rate schedule has {name} {sd_value}, this "
                    f"run's {cls_value} (lr_decay_iters defaults to train_iters)",
                    hint="set override_opt_param_scheduler: true to use this run's schedule, "
                    "or use_checkpoint_opt_param_scheduler: true to keep the checkpoint's",
                ) from None

        return check_and_set

    return wrapper


@register_patch(
    "megatron.resume_schedule_mismatch",
    backend="megatron",
    phase="before_train",
    backend_versions=TESTED,
    target="megatron.core.optimizer_param_scheduler.OptimizerParamScheduler._check_and_set",
    tags=("reliability",),
)
def resume_schedule_mismatch(ctx: PatchContext) -> None:
    """A resume whose learning-rate schedule differs from the checkpoint's (a longer
    train_iters, another lr) is a config error naming the key and both fixes, not Megatron's
    assertion traceback."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    ctx.wrap(OptimizerParamScheduler, "_check_and_set", _schedule_error(ctx))
