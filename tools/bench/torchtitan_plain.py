"""TorchTitan run directly, no Primus: the peer for bench_torchtitan.py.

A config_registry module for TorchTitan's own entry point:

    PYTHONPATH=tools/bench python -m torchtitan.train --module torchtitan_plain \
        --config llama3_1b_synthetic --training.steps 30 ...

Llama 3.2 1B is TorchTitan's llama3 "1B" flavor, Llama 3.1 8B its "8B" (`llama3_8b_synthetic`),
with FlexAttention, TorchTitan's default (`..._varlen`: its varlen attention); the data is a
synthetic token stream (TorchTitan ships no dataset in its wheel), built here from TorchTitan's
own dataloader base class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import IterableDataset
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.optimizer import default_adamw
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.trainer import Trainer


class VocabOnly(BaseTokenizer):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 128256

    def __init__(self, config: Config, **_: Any) -> None:
        super().__init__()
        self.size = config.vocab_size

    def encode(self, *args: Any, **kwargs: Any) -> list[int]:
        raise NotImplementedError

    def decode(self, *args: Any, **kwargs: Any) -> str:
        raise NotImplementedError

    def get_vocab_size(self) -> int:
        return self.size


class RandomRuns(IterableDataset):
    def __init__(self, vocab: int, seq_len: int) -> None:
        self.vocab, self.seq_len = vocab, seq_len

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            tokens = (
                torch.randint(0, self.vocab, (1,), generator=g) + torch.arange(self.seq_len + 1)
            ) % self.vocab
            yield {"input": tokens[:-1], "positions": torch.arange(self.seq_len)}, tokens[1:]


class SyntheticLoader(ParallelAwareDataloader):
    @dataclass(kw_only=True, slots=True)
    class Config(ParallelAwareDataloader.Config):
        dataset: str = "synthetic"

    def __init__(self, config: Config, *, dp_world_size: int, dp_rank: int, tokenizer: BaseTokenizer,
                 seq_len: int, local_batch_size: int, **_: Any) -> None:  # fmt: skip
        super().__init__(RandomRuns(tokenizer.get_vocab_size(), seq_len), dp_rank=dp_rank,
                         dp_world_size=dp_world_size, batch_size=local_batch_size)  # fmt: skip


def _synthetic(flavor: str, attn_backend: str = "flex") -> Trainer.Config:
    spec = model_registry(flavor, attn_backend=attn_backend)
    vocab = decoder_vocab_size(spec)
    return Trainer.Config(
        model_spec=spec,
        loss=ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab)),
        optimizer=default_adamw(lr=3e-4),
        tokenizer=VocabOnly.Config(vocab_size=vocab),
        dataloader=SyntheticLoader.Config(),
        hf_assets_path=".",
    )


def llama3_1b_synthetic() -> Trainer.Config:
    """Llama 3.2 1B (TorchTitan's "1B" flavor)."""
    return _synthetic("1B")


def llama3_8b_synthetic() -> Trainer.Config:
    """Llama 3.1 8B (TorchTitan's "8B" flavor)."""
    return _synthetic("8B")


def llama3_1b_synthetic_varlen() -> Trainer.Config:
    """Llama 3.2 1B with TorchTitan's varlen attention."""
    return _synthetic("1B", "varlen")


def llama3_8b_synthetic_varlen() -> Trainer.Config:
    """Llama 3.1 8B with TorchTitan's varlen attention."""
    return _synthetic("8B", "varlen")
