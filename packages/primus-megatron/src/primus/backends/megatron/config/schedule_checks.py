"""What Megatron asserts of the training length and the learning-rate schedule, in
`validate_args` or only when training starts (its OptimizerParamScheduler): checked from the
params over Megatron's defaults, without importing Megatron."""

from __future__ import annotations

import argparse
import re

from primus.backends.megatron.config.model_checks import last_set
from primus.core.config import ModuleConfig


def check_schedule(config: ModuleConfig, args: argparse.Namespace) -> None:
    """The run's length in one unit (iterations or samples), and a learning-rate schedule
    Megatron's scheduler takes (`args`: `megatron_values`)."""
    if not args.skip_train:
        _check_length(config, args)
        _check_evaluation(config, args)
    _check_lr_schedule(config, args)


def _check_length(config: ModuleConfig, args: argparse.Namespace) -> None:
    """Megatron trains for train_iters or for train_samples, and counts the schedule's decay and
    warm-up in the same unit."""
    if args.train_iters and args.train_samples:
        raise config.error(
            last_set(config, "train_samples", "train_iters"),
            f"train_iters ({args.train_iters}) and train_samples ({args.train_samples}) are both "
            "set: Megatron trains for iterations or for samples",
            hint="set train_samples: null to train for iterations, or set train_iters: null to "
            "train for samples",
        )
    if not (args.train_iters or args.train_samples):
        raise config.error(
            "train_iters",
            "train_iters and train_samples are both unset: Megatron needs the run's length",
            hint="set train_iters (or train_samples)",
        )
    unit, other = ("iters", "samples") if args.train_iters else ("samples", "iters")
    for key, default in ((f"lr_decay_{other}", "null"), (f"lr_warmup_{other}", "0")):
        if getattr(args, key):
            raise config.error(
                key,
                f"{key} is {getattr(args, key)} in a run of train_{unit}: Megatron counts the "
                f"schedule in the run's unit, {unit}",
                hint=f"set {key}: {default} (lr_decay_{unit}, lr_warmup_{unit} count {unit})",
            )
    warmup = f"lr_warmup_{unit}"
    if args.lr_warmup_fraction is not None and getattr(args, warmup):
        raise config.error(
            last_set(config, "lr_warmup_fraction", warmup),
            f"lr_warmup_fraction ({args.lr_warmup_fraction}) and {warmup} "
            f"({getattr(args, warmup)}) are both set: Megatron warms up over one of them",
            hint=f"set {warmup}: 0 to warm up over the fraction, or set lr_warmup_fraction: null",
        )


def _check_lr_schedule(config: ModuleConfig, args: argparse.Namespace) -> None:
    """What Megatron's OptimizerParamScheduler asserts when training starts (validate_args only
    some of it), found here."""
    if args.lr is None:
        raise config.error("lr", "lr is not set: Megatron has no default learning rate",
                           hint="set lr: <learning rate>")  # fmt: skip
    if args.min_lr > args.lr:
        raise config.error(
            last_set(config, "min_lr", "lr"),
            f"min_lr {args.min_lr} is above lr {args.lr}: the schedule decays from lr to min_lr",
            hint=f"set min_lr to at most lr ({args.lr}), or set lr to at least {args.min_lr}",
        )
    if args.lr_warmup_init > args.lr:
        raise config.error("lr_warmup_init", f"lr_warmup_init {args.lr_warmup_init} is above "
                           f"lr {args.lr}", hint="set lr_warmup_init to at most lr")  # fmt: skip
    if args.lr_warmup_fraction is not None:
        if not 0 <= args.lr_warmup_fraction < 1:
            raise config.error("lr_warmup_fraction", "lr_warmup_fraction must lie in [0, 1)",
                               hint="set lr_warmup_fraction below 1")  # fmt: skip
        return
    unit = "iters" if args.train_iters else "samples"
    warmup = getattr(args, f"lr_warmup_{unit}")
    decay = getattr(args, f"lr_decay_{unit}") or getattr(args, f"train_{unit}")
    if decay and warmup >= decay:
        raise config.error(
            f"lr_warmup_{unit}",
            f"lr_warmup_{unit} {warmup} leaves no decay: the schedule decays over {decay} "
            f"(lr_decay_{unit}, else train_{unit})",
            hint=f"set lr_warmup_{unit} below {decay}",
        )


def _check_evaluation(config: ModuleConfig, args: argparse.Namespace) -> None:
    """With eval_iters above 0 Megatron evaluates every eval_interval iterations and after
    training, on the split's validation share: with none (a `data:` section gives the whole
    corpus to training) the first evaluation fails, minutes into the run."""
    if not args.eval_iters or args.mock_data or not args.data_path or args.valid_data_path:
        return
    shares = [float(share) for share in re.findall(r"[.0-9]+", str(args.split))]  # as Megatron
    if len(shares) < 2 or shares[1] == 0:
        raise config.error(
            "eval_iters",
            f"eval_iters is {args.eval_iters}, and split {args.split!r} holds out no validation "
            "data: Megatron's first evaluation would fail",
            hint="set eval_iters: 0, or name validation data (valid_data_path), or hold some "
            "out with split (99,1,0) beside data_path (a data: section gives training it all)",
        )
