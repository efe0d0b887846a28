"""What Primus's fine-tuning on TorchTitan does not cover, refused from the params (the
adapter's `check_params`) before TorchTitan is imported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.core.config import ModuleConfig
from primus.core.errors import ConfigError

LOSS_CHUNKS = 8  # SFT's loss: ChunkedLossWrapper's num_chunks (config.bridge's default)


def check_finetuning(config: ModuleConfig, value: Callable[[str], Any]) -> None:
    """What Primus's fine-tuning on TorchTitan does not cover, for a module with `sft:` or
    `peft:` (`value`: a dotted key's value, or its default), without TorchTitan."""
    if config.sft is None:
        return
    if config.dpo is not None and config.init_from is None:
        raise config.dpo.error(
            "beta",
            "torchtitan: DPO's reference model is the run's initial weights, the HF import of "
            "init_from.hf, and the module has no init_from",
            hint="set init_from: {hf: DIR} (the model to train and to hold as the reference)",
        )
    if config.sft.packing and value("model.attn_backend") == "sdpa":
        raise config.error(
            "model.attn_backend",
            "torchtitan: model.attn_backend sdpa is causal over the whole row, so packed "
            "samples (sft.packing: true) would attend to the samples before them",
            hint="use flex or varlen (they mask each sample from the others), or set "
            "sft.packing: false",
        )
    for key in ("pipeline_parallel_degree", "context_parallel_degree"):
        if value(f"parallelism.{key}") != 1:
            raise config.error(
                f"parallelism.{key}",
                f"torchtitan: fine-tuning runs without parallelism.{key} (the eval and the "
                "SFT rows are not split across stages or sequence shards)",
            )
    tp = value("parallelism.tensor_parallel_degree")
    shards = tp if tp > 1 and value("parallelism.enable_sequence_parallel") else 1
    if config.dpo is None and config.sft.seq_length % (LOSS_CHUNKS * shards):  # DPO: own loss
        multiple = LOSS_CHUNKS * shards
        raise config.sft.error(
            "seq_length",
            f"torchtitan: sft.seq_length {config.sft.seq_length} is not a multiple of "
            f"{multiple} (its loss splits each row{' shard' if shards > 1 else ''} into "
            f"{LOSS_CHUNKS} chunks)",
            hint=f"set sft.seq_length to a multiple of {multiple}, e.g. "
            f"{-(-config.sft.seq_length // multiple) * multiple}",
        )
    freq, log_freq = value("validator.freq"), value("metrics.log_freq")
    evaluates = config.sft.eval is not None or config.sft.eval_fraction > 0
    if evaluates and freq % log_freq:
        raise ConfigError(
            f"torchtitan: validator.freq {freq} is not a multiple of metrics.log_freq {log_freq}",
            hint="the eval is reported on the step line of the step it follows",
        )
