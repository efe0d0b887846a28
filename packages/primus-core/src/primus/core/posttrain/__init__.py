"""Fine-tuning without a framework: the `sft:`/`peft:`/`dpo:` keys, reading and checking the
data, tokenizing with the chat template and a loss mask, packing, the eval metrics, and
preference training's pairs and loss. Backends
feed the rows to their trainers (docs/posttrain.md). numpy, transformers and pyarrow are
imported when used, never by this import."""

from primus.core.config.posttrain import DPOConfig, PeftConfig, SFTConfig
from primus.core.posttrain.dataset import SFTData, SFTDataset, build_sft_data
from primus.core.posttrain.metrics import (
    TokenStats,
    masked_mean,
    token_stats,
    token_stats_torch,
    token_sums,
)
from primus.core.posttrain.preference import (
    EVAL_METRICS,
    REFERENCE_KEY,
    REWARD_METRICS,
    PairData,
    PairDataset,
    build_pair_data,
    dpo_eval_metrics,
    dpo_eval_sums_torch,
    dpo_loss_torch,
    sequence_logps_torch,
)

__all__ = [
    "EVAL_METRICS",
    "REFERENCE_KEY",
    "REWARD_METRICS",
    "DPOConfig",
    "PairData",
    "PairDataset",
    "PeftConfig",
    "SFTConfig",
    "SFTData",
    "SFTDataset",
    "TokenStats",
    "build_pair_data",
    "build_sft_data",
    "dpo_eval_metrics",
    "dpo_eval_sums_torch",
    "dpo_loss_torch",
    "masked_mean",
    "sequence_logps_torch",
    "token_stats",
    "token_stats_torch",
    "token_sums",
]
