"""Helpers for TorchTitan's tests (on the CPU and on the GPU): an experiment's runtime in this
process, the tokens of its first training step, a local jsonl corpus and its tokenizer."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from primus.core.patches import restore_all


@contextmanager
def runtime(exp: Path, *overrides: str) -> Iterator[Any]:
    """`primus`'s runtime for `exp` in this process; the environment and the names the patches
    replaced are put back afterwards."""
    from primus.core.runtime.primus_runtime import PrimusRuntime

    saved = dict(os.environ)
    try:
        yield PrimusRuntime(exp, list(overrides))
    finally:
        os.environ.clear()
        os.environ.update(saved)
        restore_all()


def first_batch(exp: Path, *overrides: str) -> torch.Tensor:
    """The tokens (local batch, seq + 1) of the first step of a mock-data run of `exp` on one
    rank, as the run's own dataloader draws them: inputs, then the last label."""
    with runtime(exp, *overrides) as rt:
        config = rt.backend_args()
        loader = config.dataloader.build(
            dp_world_size=1,
            dp_rank=0,
            tokenizer=config.tokenizer.build(tokenizer_path=config.hf_assets_path),
            seq_len=config.training.seq_len,
            local_batch_size=config.training.local_batch_size,
        )
        inputs, labels = next(iter(loader))
    return torch.cat([inputs["input"], labels[:, -1:]], dim=1)


WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "cats",
    "sleep",
]


def write_tokenizer(folder: Path, texts: list[str]) -> int:
    """A small BPE tokenizer in TorchTitan's hf_assets_path layout; returns its vocab size."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    special = ["<unk>", "<s>", "</s>"]
    tokenizer.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=300, special_tokens=special)
    )
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer.get_vocab_size()


def write_corpus(folder: Path, rows: int = 400) -> tuple[list[str], list[str]]:
    """`folder`/corpus.jsonl (rows `{"id": i, "text": ...}`, the words rotated by i mod 7) and
    its tokenizer in `folder`/tokenizer; returns the texts and the overrides that train on
    them."""
    texts = [" ".join(WORDS[i % 7 :] + WORDS[: i % 7]) for i in range(rows)]
    vocab = write_tokenizer(folder / "tokenizer", texts)
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    overrides = [
        "mock_data=false",
        "dataloader.dataset=jsonl",
        f"dataloader.dataset_path={corpus}",
        f"hf_assets_path={folder / 'tokenizer'}",
        f"model.vocab_size={vocab}",
    ]
    return texts, overrides
