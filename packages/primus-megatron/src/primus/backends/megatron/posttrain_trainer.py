"""The posttrain trainer: megatron.training's `pretrain()` loop on the module's SFT rows, or
with `dpo:`, on its preference pairs."""

from __future__ import annotations

from pathlib import Path

from primus.backends.megatron.pretrain_trainer import MegatronPretrainTrainer
from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0


class MegatronPosttrainTrainer(MegatronPretrainTrainer):
    """Fine-tunes from the `init_from` import (or the run's latest checkpoint) on
    `build_sft_data(module.sft)`, evaluating every `eval_interval` steps; with `peft:`, only
    the LoRA adapters train (primus.backends.megatron.posttrain.lora); with `dpo:`, on
    `build_pair_data(module.sft)` against the run's initial weights, its eval on the eval
    pairs (posttrain.dpo)."""

    stages = ("posttrain",)

    def setup(self) -> None:
        from primus.backends.megatron.checkpoint.hf_mapping import padded_vocab_size
        from primus.backends.megatron.checkpoint.native import is_imported
        from primus.backends.megatron.posttrain import dpo, lora, sft
        from primus.core.posttrain import PairData, SFTData, build_pair_data, build_sft_data

        args = self.backend_args
        self.data: SFTData | PairData
        if args.primus_dpo is not None:
            self.data = build_pair_data(args.primus_sft)
            log_rank_0(f"[megatron] dpo train: {self.data.train.describe()}")
            log_rank_0(f"[megatron] DPO: {dpo.describe(args.primus_dpo, bool(args.primus_peft))}")
            if args.primus_peft is None:  # the reference: the HF import's weights, frozen
                args.primus_dpo_reference = self._hf_import("DPO's reference")
        else:
            self.data = build_sft_data(args.primus_sft)
            log_rank_0(f"[megatron] sft train: {self.data.train.describe()}")
        args.padded_vocab_size = padded_vocab_size(args)  # the model's, not the tokenizer's
        args.eval_iters = 0
        if self.data.eval is not None:
            kind = "sft" if args.primus_dpo is None else "dpo"
            log_rank_0(f"[megatron] {kind} eval: {self.data.eval.describe()}")
            if args.eval_interval % args.log_interval:
                raise ConfigError(
                    f"megatron: eval_interval {args.eval_interval} is not a multiple of "
                    f"log_interval {args.log_interval}",
                    hint="the eval is reported on the step line of the step it follows",
                )
            args.eval_iters = sft.eval_batches(self.data.eval, args.global_batch_size)
        if args.primus_peft is not None:
            args.primus_lora_base = self._hf_import("LoRA")
            if is_imported(Path(args.load)):  # a fresh fine-tune: no adapters yet
                args.load = None
            log_rank_0(f"[megatron] LoRA: {lora.describe(args.primus_peft)}")
        super().setup()

    def _hf_import(self, what: str) -> str:
        """The run's HF import (iteration 0), which `what` needs as the base model."""
        import_dir = Path(self.backend_args.load or "") / "iter_0000000"
        if not import_dir.is_dir():
            raise ConfigError(
                f"megatron: {what} needs the base model as the run's HF import (iteration 0)",
                hint="set init_from: {hf: DIR}, or run primus checkpoint import first",
            )
        return str(import_dir)

    def train(self) -> None:
        from megatron.core.enums import ModelType
        from megatron.training import pretrain
        from primus.backends.megatron import providers
        from primus.backends.megatron.posttrain import dpo, sft
        from primus.core.posttrain import PairDataset

        args = self.backend_args
        if self.resumes_finished():
            return
        log_rank_0(f"[megatron] posttrain: {args.train_iters} iterations")
        lora = args.primus_peft is not None
        forward_step = (
            sft.forward_step if args.primus_dpo is None else dpo.forward_step(args.primus_dpo, lora)
        )
        provide = sft.datasets_provider(
            self.data.train, self.data.eval, args.primus_sft.packing, args.global_batch_size
        )
        model_provider = providers.model_provider
        if args.primus_dpo is not None and args.primus_dpo.precompute_reference:
            pairs = [p for p in (self.data.train, self.data.eval) if isinstance(p, PairDataset)]
            provide, model_provider = dpo.precomputing(
                provide, model_provider, pairs, lora, args.micro_batch_size
            )
        pretrain(
            self.cfg,
            provide,
            ModelType.encoder_or_decoder,
            forward_step,
            model_provider=model_provider,
        )
        self.say_if_finished()
