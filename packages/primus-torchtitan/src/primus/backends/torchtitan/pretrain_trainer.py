"""The pretrain trainer: TorchTitan's own Trainer, built from the Trainer.Config Primus made."""

from __future__ import annotations

from typing import Any

from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0
from primus.core.trainer.base_trainer import BaseTrainer


class TorchTitanPretrainTrainer(BaseTrainer):
    """`backend_args` is TorchTitan's `Trainer.Config`."""

    trainer: Any = None

    def init(self) -> None:
        from primus.backends.torchtitan.checkpoint.hf import start_from_import

        imported = start_from_import(self.backend_args)
        if imported:
            log_rank_0(f"[torchtitan] starts from the imported weights in {imported} unless the run "
                       "has a step-N checkpoint")  # fmt: skip
        self.build()

    def build(self) -> None:
        """TorchTitan's Trainer from the config (a prepared corpus's loader told the steps and
        the global batch, which fix its samples)."""
        from primus.backends.torchtitan.data.corpus import CorpusDataLoader

        config = self.backend_args
        if isinstance(config.dataloader, CorpusDataLoader.Config):
            config.dataloader._steps = config.training.steps
            config.dataloader._global_batch = config.training.global_batch_size
        try:
            self.trainer = self.backend_args.build()
        except NotImplementedError as exc:  # TorchTitan's word for a combination it lacks
            raise ConfigError(f"TorchTitan does not support this configuration: {exc}") from exc

    def train(self) -> None:
        log_rank_0(f"[torchtitan] training: {self.backend_args.training.steps} steps")
        trainer = self.trainer
        go_on = trainer.should_continue_training

        def first_check() -> bool:  # after the checkpoint is loaded, before the first step
            del trainer.should_continue_training  # TorchTitan's own from now on
            if not (going := go_on()) and trainer.step > 0:
                self.already_finished(trainer.step, "training.steps")
            return going

        trainer.should_continue_training = first_check  # TorchTitan trains nothing silently
        self.trainer.train()

    def cleanup(self, on_error: bool = False) -> None:
        import torch.distributed as dist

        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
        if dist.is_available() and dist.is_initialized():
            if not on_error and dist.get_world_size() > 1:
                # every rank tears down together: a gloo rank whose peer has already exited
                # can abort (SIGABRT) on the closed connection while it cleans up
                dist.barrier()
            dist.destroy_process_group()
