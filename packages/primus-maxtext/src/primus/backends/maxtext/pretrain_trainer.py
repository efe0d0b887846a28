"""The pretrain trainer: MaxText's own `maxtext.trainers.pre_train.train.main`, in two halves."""

from __future__ import annotations

from typing import Any

from primus.core.logging import log_rank_0
from primus.core.trainer.base_trainer import BaseTrainer


class MaxTextPretrainTrainer(BaseTrainer):
    """`backend_args` is a MaxTextArgs: MaxText's argv, already validated by the adapter.

    init() is MaxText's `initialize(argv)` (config, JAX settings, goodput recorder); train() is
    the rest of its `main`: the training loop with checkpointing, tensorboard and its step log.
    """

    config: Any = None
    recorder: Any = None

    def init(self) -> None:
        from maxtext.trainers.pre_train import train

        self.config, self.recorder = train.initialize(self.backend_args.argv)

    def train(self) -> None:
        import jax

        from maxtext.common.goodput import (
            RECORD_JOB_START_TIME,
            maybe_monitor_goodput,
            record_goodput,
        )
        from maxtext.trainers.pre_train import train

        devices = jax.devices()
        log_rank_0(
            f"[maxtext] training: {self.config.steps} steps on {len(devices)} "
            f"{devices[0].platform} device(s) in {jax.process_count()} process(es)"
        )
        record_goodput(self.recorder, RECORD_JOB_START_TIME)
        with maybe_monitor_goodput(self.config):
            train.get_train_func(self.config, self.recorder, self.backend_args.argv)()
