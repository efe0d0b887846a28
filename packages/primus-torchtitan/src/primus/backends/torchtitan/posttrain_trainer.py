"""The posttrain trainer: TorchTitan's own Trainer on the module's SFT rows."""

from __future__ import annotations

from primus.backends.torchtitan.pretrain_trainer import TorchTitanPretrainTrainer
from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0


class TorchTitanPosttrainTrainer(TorchTitanPretrainTrainer):
    """Fine-tunes from the `init_from` import (or the run's latest step-N checkpoint) on
    `build_sft_data(module.sft)` (primus.backends.torchtitan.posttrain.sft), evaluating every
    `validator.freq` steps; with `peft:`, only TorchTitan's LoRA adapters train."""

    stages = ("posttrain",)

    def init(self) -> None:
        from primus.backends.torchtitan.checkpoint.hf import adapters_from_peft, import_dir
        from primus.backends.torchtitan.posttrain import lora
        from primus.core.posttrain import build_sft_data

        config = self.backend_args
        data = build_sft_data(config.dataloader._sft)
        log_rank_0(f"[torchtitan] sft train: {data.train.describe()}")
        config.dataloader._rows = data.train
        config.dataloader._global_batch = config.training.global_batch_size
        if config.validator.enable:
            if data.eval is None:
                raise ConfigError("torchtitan: validator.enable needs an eval split",
                                  hint="set sft.eval or sft.eval_fraction")  # fmt: skip
            log_rank_0(f"[torchtitan] sft eval: {data.eval.describe()}")
            config.validator._rows = data.eval
        if not lora.adapted_linears(config):
            super().init()
            return
        base = import_dir(config)
        if not (base / ".metadata").is_file():
            raise ConfigError(
                "torchtitan: LoRA needs the base model as the run's HF import",
                hint="set init_from: {hf: DIR}, or run primus checkpoint import first",
            )
        self.build()  # the import is not TorchTitan's initial load: it holds no adapters
        (model,) = self.trainer.model_parts
        loaded = lora.load_base(model, base)
        lora.init_adapters(model, config.debug.seed or 0)  # a resume loads them afterwards
        log_rank_0(f"[torchtitan] LoRA: {loaded} frozen tensors from {base}")
        peft = config.dataloader._peft
        if peft is not None and peft.dropout:
            count = lora.add_dropout(model, peft.dropout)
            log_rank_0(f"[torchtitan] LoRA: dropout {peft.dropout:g} on {count} adapters' input")
        if peft is not None and peft.adapter is not None:
            lora.set_adapters(model, adapters_from_peft(config, peft.adapter))
            log_rank_0(f"[torchtitan] LoRA: the adapters start from {peft.adapter}")
