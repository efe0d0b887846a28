"""The pretrain trainer: megatron.training's `pretrain()` with Primus's providers."""

from __future__ import annotations

import warnings
from pathlib import Path

from primus.core.logging import log_rank_0
from primus.core.trainer.base_trainer import BaseTrainer


class MegatronPretrainTrainer(BaseTrainer):
    """`backend_args` is Megatron's validated args namespace."""

    def setup(self) -> None:
        from megatron.training.global_vars import set_global_variables
        from primus.backends.megatron.checkpoint.native import is_imported
        from primus.core.errors import ConfigError
        from primus.core.launch.dist_env import get_torchrun_env

        args, running = self.backend_args, get_torchrun_env().world_size
        if args.world_size != running:  # args validated for one process: see build_megatron_args
            raise ConfigError(
                f"megatron: this parallel layout needs {args.world_size} processes (tensor x "
                f"pipeline x context parallel); {running} running",
                hint=f"primus train --nproc-per-node {args.world_size} ...",
            )
        if args.load and is_imported(Path(args.load)) and not args.finetune:
            # an HF import: the model weights only, with a fresh optimizer, schedule and RNG
            args.finetune = True
            log_rank_0(f"[megatron] starting from the HF import in {args.load} (weights only)")
        # pretrain() reads the global args; set them from ours, not from sys.argv.
        set_global_variables(args)

    def init(self) -> None:
        from megatron.training.argument_utils import pretrain_cfg_container_from_args

        with warnings.catch_warnings():  # Primus passes a model provider, not a ModelConfig
            warnings.filterwarnings("ignore", message=r"\s*It is recommended to use a ModelConfig")
            self.cfg = pretrain_cfg_container_from_args(self.backend_args)

    def train(self) -> None:
        from megatron.core.enums import ModelType
        from megatron.training import pretrain
        from primus.backends.megatron import providers

        if self.resumes_finished():
            return
        log_rank_0(f"[megatron] pretrain: {self.backend_args.train_iters} iterations")
        pretrain(
            self.cfg,
            providers.datasets_provider,
            ModelType.encoder_or_decoder,
            providers.forward_step,
            model_provider=providers.model_provider,
        )
        self.say_if_finished()

    def resumes_finished(self) -> bool:
        """Whether the checkpoint the run resumes from is at train_iters or past it where
        save_interval does not divide its iteration: then `already_finished`, before the model
        is built. Megatron would build and load it, train nothing, and write the same final
        checkpoint again in place (minutes at 8B). Elsewhere Megatron loads it (checking it
        against this run's model) and `say_if_finished` says so after."""
        from primus.backends.megatron.checkpoint.native import latest_iteration

        args = self.backend_args
        if not (args.load and args.save and args.save_interval and args.train_iters):
            return False
        if args.finetune or args.train_samples or getattr(args, "ckpt_step", None):
            return False
        saved = latest_iteration(Path(args.load))
        if saved is None or saved < args.train_iters or saved % args.save_interval == 0:
            return False
        log_rank_0(f"[megatron] the checkpoint in {args.load} is at iteration {saved}")
        self.already_finished(saved, "train_iters")
        return True

    def say_if_finished(self) -> None:
        """After `pretrain()`: where the checkpoint it resumed from was at train_iters or past
        it, Megatron trained nothing (and said nothing of it): `already_finished`."""
        from megatron.training import get_args

        args = get_args()
        if args.iteration and args.train_iters and args.iteration >= args.train_iters:
            if args.train_samples:  # train_iters derived from it
                self.already_finished(args.iteration, "train_samples", args.consumed_train_samples)
            else:
                self.already_finished(args.iteration, "train_iters")

    def cleanup(self, on_error: bool = False) -> None:
        import torch.distributed as dist

        release_cuda_graphs()
        if dist.is_available() and dist.is_initialized():
            if not on_error:
                dist.barrier()
            dist.destroy_process_group()


def release_cuda_graphs() -> None:
    """Reset Megatron's full-iteration CUDA graphs (turbo.cuda_graphs). A graph that captured
    NCCL work keeps the communicator busy: destroying the process group before it hangs in
    ncclCommDestroy (pytorch/pytorch#115388); seen on two H200s, data parallel 2, the process
    never exiting after its last step."""
    import sys

    module = sys.modules.get("megatron.core.full_cuda_graph")
    if module is None:  # no graph was ever built
        return
    graphs = module.FullCudaGraphWrapper.cuda_graph
    captured = [stage for stage, graph in graphs.items() if graph is not None]
    if captured:
        import torch

        torch.cuda.synchronize()
    for stage in captured:
        graphs[stage].reset()
        graphs[stage] = None
