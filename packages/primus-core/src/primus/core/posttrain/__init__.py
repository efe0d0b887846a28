"""Fine-tuning without a framework: the `sft:`/`peft:` keys, reading and checking the data,
tokenizing with the chat template and a loss mask, packing, and the eval metrics. Backends
feed the rows to their trainers (docs/posttrain.md). numpy, transformers and pyarrow are
imported when used, never by this import."""

from primus.core.config.posttrain import PeftConfig, SFTConfig
from primus.core.posttrain.dataset import SFTData, SFTDataset, build_sft_data
from primus.core.posttrain.metrics import (
    TokenStats,
    masked_mean,
    token_stats,
    token_stats_torch,
    token_sums,
)

__all__ = [
    "PeftConfig",
    "SFTConfig",
    "SFTData",
    "SFTDataset",
    "TokenStats",
    "build_sft_data",
    "masked_mean",
    "token_stats",
    "token_stats_torch",
    "token_sums",
]
