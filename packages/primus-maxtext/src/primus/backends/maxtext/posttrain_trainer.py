"""The posttrain trainer: MaxText's own training loop on the module's SFT rows."""

from __future__ import annotations

from typing import Any

from primus.backends.maxtext.pretrain_trainer import MaxTextPretrainTrainer
from primus.core.errors import ConfigError


class MaxTextPosttrainTrainer(MaxTextPretrainTrainer):
    """Fine-tunes from the `init_from` import (or the run's latest checkpoint) on
    `build_sft_data(module.sft)`: the patch `maxtext.sft_data` feeds the rows to MaxText's
    loop (`maxtext.trainers.pre_train.train`) and evaluates with core's token sums."""

    stages = ("posttrain",)
    sft_rows: Any = None  # set by the maxtext.sft_data patch

    def train(self) -> None:
        if self.sft_rows is None:
            raise ConfigError(
                "maxtext: the patch maxtext.sft_data did not run, so MaxText would train on "
                "synthetic data",
                hint="leave maxtext.posttrain and maxtext.sft_data enabled (PRIMUS_PATCHES)",
            )
        super().train()
