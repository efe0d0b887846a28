"""The posttrain trainer: TorchTitan's own Trainer on the module's SFT rows or DPO pairs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.backends.torchtitan.pretrain_trainer import TorchTitanPretrainTrainer
from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0


class TorchTitanPosttrainTrainer(TorchTitanPretrainTrainer):
    """Fine-tunes from the `init_from` import (or the run's latest step-N checkpoint) on
    `build_sft_data(module.sft)` (primus.backends.torchtitan.posttrain.sft), evaluating every
    `validator.freq` steps; with `peft:`, only TorchTitan's LoRA adapters train. With `dpo:`,
    trains on `build_pair_data(module.sft)` with the DPO loss (posttrain.dpo), whose step
    (`dpo`) the step metrics read the rewards from and the validator evaluates pairs with."""

    stages = ("posttrain",)
    dpo: Any = None  # posttrain.dpo.DPOStep, with dpo:

    def init(self) -> None:
        from primus.core.posttrain import build_pair_data, build_sft_data

        config = self.backend_args
        dpo = config.dataloader._dpo
        data = (build_pair_data if dpo is not None else build_sft_data)(config.dataloader._sft)
        log_rank_0(f"[torchtitan] {'dpo' if dpo else 'sft'} train: {data.train.describe()}")
        config.dataloader._rows = data.train
        config.dataloader._global_batch = config.training.global_batch_size
        self.build_model(data)
        if dpo is not None:
            self.use_dpo(dpo, data)

    def use_dpo(self, dpo: Any, data: Any) -> None:
        """DPO's step in place of TorchTitan's forward-backward body; the reference: the base
        (adapters off) with LoRA, else a frozen model holding the HF import's weights."""
        from primus.backends.torchtitan.posttrain.dpo import DPOStep, reference_model

        config = self.backend_args
        reference = None
        if config.dataloader._peft is None:
            base = imported(config, "DPO needs its reference model")
            reference = reference_model(self.trainer, base)
            log_rank_0(f"[torchtitan] DPO: the reference model holds the weights of {base}")
        else:
            log_rank_0("[torchtitan] DPO: the reference is the base model (the adapters off)")
        self.dpo = self.trainer.fwd_bwd_fn = DPOStep(self.trainer, dpo, reference)
        if dpo.precompute_reference:
            self.dpo.precompute([data.train, *([data.eval] if config.validator.enable else [])])
        if config.validator.enable:  # the eval pairs, against the same reference
            self.trainer.validator.dpo = self.dpo

    def build_model(self, data: Any) -> None:
        """TorchTitan's Trainer, with LoRA's frozen weights and adapters set."""
        from primus.backends.torchtitan.checkpoint.hf import adapters_from_peft
        from primus.backends.torchtitan.posttrain import lora

        config = self.backend_args
        if config.validator.enable:
            if data.eval is None:
                raise ConfigError("torchtitan: validator.enable needs an eval split",
                                  hint="set sft.eval or sft.eval_fraction")  # fmt: skip
            kind = "sft" if config.dataloader._dpo is None else "dpo"
            log_rank_0(f"[torchtitan] {kind} eval: {data.eval.describe()}")
            config.validator._rows = data.eval
        if not lora.adapted_linears(config):
            super().init()
            return
        base = imported(config, "LoRA needs the base model")
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


def imported(config: Any, needs: str) -> Path:
    """The run's HF import (a DCP folder); a ConfigError, saying who `needs` it, without."""
    from primus.backends.torchtitan.checkpoint.hf import import_dir

    base = import_dir(config)
    if not (base / ".metadata").is_file():
        raise ConfigError(f"torchtitan: {needs} as the run's HF import",
                          hint="set init_from: {hf: DIR}, or run primus checkpoint import first")  # fmt: skip
    return base
