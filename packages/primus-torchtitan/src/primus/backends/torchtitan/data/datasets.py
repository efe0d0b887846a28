"""Data for TorchTitan: a synthetic token stream (mock data) and local jsonl/parquet datasets.

Imported only when a config is built: it subclasses TorchTitan's tokenizer and dataloader.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils.data import IterableDataset

from primus.backends.torchtitan.data.inputs import LOCAL_FORMATS
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.hf_datasets import DatasetConfig


class MockTokenizer(BaseTokenizer):
    """Stands in for a tokenizer when training on mock data: only the vocabulary size is real."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 32000

    def __init__(self, config: Config, **_: Any) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        raise NotImplementedError("mock data needs no tokenizer: set dataloader.dataset for text")

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError("mock data needs no tokenizer")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class SyntheticTokens(IterableDataset):
    """Endless learnable sequences (runs of consecutive token ids); resumable by sample count."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.sample = 0

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        positions = torch.arange(self.seq_len)
        while True:
            start = torch.randint(
                0,
                self.vocab_size,
                (1,),
                generator=torch.Generator().manual_seed(self.seed + self.sample),
            )
            tokens = (start + torch.arange(self.seq_len + 1)) % self.vocab_size
            self.sample += 1
            yield {"input": tokens[:-1], "positions": positions}, tokens[1:]

    def state_dict(self) -> dict[str, int]:
        return {"sample": self.sample}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sample = state["sample"]


class MockDataLoader(ParallelAwareDataloader):
    """TorchTitan's parallel-aware dataloader over `SyntheticTokens` (one stream per DP rank)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "mock"
        seed: int = 1234

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer,
        seq_len: int,
        local_batch_size: int,
        **_: Any,
    ) -> None:
        dataset = SyntheticTokens(
            tokenizer.get_vocab_size(), seq_len, config.seed + 1_000_003 * dp_rank
        )
        super().__init__(
            dataset, dp_rank=dp_rank, dp_world_size=dp_world_size, batch_size=local_batch_size
        )


def _load_local(fmt: str, path: str) -> Any:
    from datasets import load_dataset

    return load_dataset(fmt, data_files=path, split="train")


def register_local_datasets() -> list[str]:
    """Add `jsonl` and `parquet` (a local file or glob, `text` field) to TorchTitan's datasets."""
    from torchtitan.hf_datasets import text_datasets

    for name, fmt in LOCAL_FORMATS.items():
        text_datasets.DATASETS[name] = DatasetConfig(
            path="", loader=partial(_load_local, fmt), sample_processor=lambda s: s["text"]
        )
    return list(LOCAL_FORMATS)
