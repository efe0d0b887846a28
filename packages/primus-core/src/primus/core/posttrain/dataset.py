"""The fine-tuning data a backend trains on: rows of `seq_length` positions as numpy arrays.

A sample of n tokens fills n - 1 positions: inputs tokens[:-1], targets tokens[1:]. A row
holds one sample (packing off) or several (packing on); after its samples comes padding.
Per row, all int32 of shape (seq_length,) except `cu_seqlens`:

    tokens        input token ids (padding: the pad id)
    labels        the next-token targets (padding: the pad id; never in the loss)
    loss_mask     float32, 1.0 where the target is an assistant/completion token (any
                  token with sft.train_on_prompt)
    position_ids  0, 1, ... restarting at each sample (padding: 0)
    segment_ids   1, 2, ... per sample in the row (padding: 0): attend within a segment only
    cu_seqlens    int32 (samples + 1,): where each sample starts, then where the last ends

The training samples are every record of `sft.train`'s files, or their mix by weight
(`primus.core.posttrain.mixing`); the eval samples `sft.eval`'s, or the `eval_fraction` held
out of them first.

Positions count rows from the start of training, over every epoch: position p is row
`order(p // len)[p % len]`, each epoch's order a shuffle drawn from the seed, so a run that
resumes at position p sees exactly the rows it would have seen.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from primus.core.config.posttrain import SFTConfig
from primus.core.logging import log_rank_0
from primus.core.posttrain.encode import Encoder, Sample, check_length, load_tokenizer
from primus.core.posttrain.mixing import mix
from primus.core.posttrain.packing import one_per_row, pack
from primus.core.posttrain.records import Record, read_records

Row = dict[str, Any]  # name -> numpy array
ROW_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "segment_ids", "cu_seqlens")


class SFTDataset:
    """Packed (or padded) rows, built on demand from the encoded samples."""

    def __init__(
        self, samples: list[Sample], seq_length: int, packing: bool, pad_id: int, seed: int
    ) -> None:
        import numpy as np

        self.seq_length, self.pad_id, self.seed = seq_length, pad_id, seed
        self.tokens = np.concatenate([np.asarray(s.tokens, np.int32) for s in samples])
        self.mask = np.concatenate([np.asarray(s.mask, np.float32) for s in samples])
        self.offsets = np.cumsum([0, *(len(s.tokens) for s in samples)])
        self.num_samples = len(samples)
        lengths = [len(s.tokens) - 1 for s in samples]
        self.rows = pack(lengths, seq_length) if packing else one_per_row(len(samples))
        self.positions = sum(lengths)  # positions holding a sample (the rest is padding)
        # a sample's first token is no position's target
        self.loss_tokens = int(self.mask.sum() - self.mask[self.offsets[:-1]].sum())
        self._order: tuple[int, list[int]] = (-1, [])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Row:
        """Row `index` of the unshuffled rows."""
        import numpy as np

        n = self.seq_length
        row: Row = {
            k: np.zeros(n, np.int32) for k in ("tokens", "labels", "position_ids", "segment_ids")
        }
        row["tokens"][:] = row["labels"][:] = self.pad_id
        row["loss_mask"] = np.zeros(n, np.float32)
        ends = [0]
        for segment, sample in enumerate(self.rows[index], 1):
            first, last = self.offsets[sample], self.offsets[sample + 1]
            at, size = ends[-1], last - first - 1
            row["tokens"][at : at + size] = self.tokens[first : last - 1]
            row["labels"][at : at + size] = self.tokens[first + 1 : last]
            row["loss_mask"][at : at + size] = self.mask[first + 1 : last]
            row["position_ids"][at : at + size] = np.arange(size)
            row["segment_ids"][at : at + size] = segment
            ends.append(at + size)
        row["cu_seqlens"] = np.asarray(ends, np.int32)
        return row

    def order(self, epoch: int) -> list[int]:
        """The row order of `epoch`: a shuffle drawn from the seed and the epoch."""
        if self._order[0] != epoch:
            order = list(range(len(self)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1]

    def row(self, position: int) -> Row:
        """The row at `position` (counted from the start of training, over epochs)."""
        epoch, index = divmod(position, len(self))
        return self[self.order(epoch)[index]]

    def batch(self, start: int, size: int) -> Row:
        """Rows at positions start .. start + size - 1, stacked to (size, seq_length);
        `cu_seqlens` stays a list of each row's array."""
        import numpy as np

        rows = [self.row(p) for p in range(start, start + size)]
        batch: Row = {k: np.stack([r[k] for r in rows]) for k in ROW_KEYS[:-1]}
        batch["cu_seqlens"] = [r["cu_seqlens"] for r in rows]
        return batch

    def describe(self) -> str:
        fill = self.positions / (len(self) * self.seq_length)
        return (
            f"{self.num_samples} samples in {len(self)} rows of {self.seq_length} "
            f"({fill:.1%} filled), {self.loss_tokens} tokens in the loss"
        )


@dataclass
class SFTData:
    """What `build_sft_data` returns: the train rows, the eval rows (or None), the tokenizer,
    and how many samples truncation left with nothing to train on (dropped)."""

    train: SFTDataset
    eval: SFTDataset | None
    tokenizer: Any
    dropped: int = 0


def _split(groups: list[list[Record]], cfg: SFTConfig) -> tuple[list[list[Record]], list[Record]]:
    """Hold out `eval_fraction` of all the files' records (at least one), drawn with the seed;
    the rest stay with their file."""
    records = [r for group in groups for r in group]
    count = max(1, round(len(records) * cfg.eval_fraction))
    if count >= len(records):
        raise cfg.error(
            "eval_fraction",
            f"sft.eval_fraction {cfg.eval_fraction} of {len(records)} samples leaves none to train on",
        )
    held = set(random.Random(cfg.seed).sample(range(len(records)), count))
    starts = itertools.accumulate((len(g) for g in groups[:-1]), initial=0)
    kept = [
        [r for i, r in enumerate(g, at) if i not in held]
        for g, at in zip(groups, starts, strict=True)
    ]
    return kept, [records[i] for i in sorted(held)]


def read_data(cfg: SFTConfig) -> tuple[list[Record], list[Record]]:
    """The training records (every file's, or the weighted mix) and the eval records."""
    groups = [read_records(f.path, cfg.format, f.columns) for f in cfg.train]
    held = read_records(cfg.eval, cfg.format, cfg.columns) if cfg.eval else []
    if cfg.eval_fraction:
        groups, held = _split(groups, cfg)
    weights = [f.weight for f in cfg.train if f.weight is not None]
    if len(weights) < len(cfg.train):  # none has one: every record of every file, once
        return [r for group in groups for r in group], held
    for file, group in zip(cfg.train, groups, strict=True):
        if not group:
            raise cfg.error(
                "eval_fraction",
                f"sft.eval_fraction holds out every sample of {file.path}, which has a weight",
                hint="a smaller sft.eval_fraction, or an sft.eval file",
            )
    return mix(groups, weights, cfg.seed), held


def encode_splits[T](
    cfg: SFTConfig,
    tokenizer: Any | None,
    encode: Callable[[Encoder, Record], T | None],
    what: str,
) -> tuple[Any, int, dict[str, list[T]], int]:
    """Read and encode the training and eval records with `encode` (None: truncation left
    nothing to train on): the tokenizer (loaded unless given), the pad id, each split's
    encoded samples ("train", and "eval" when there are eval records), how many were dropped.
    `what` names a sample in the error when a split keeps none."""
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg)
    encoder = Encoder(tokenizer, cfg)
    train, held = read_data(cfg)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    splits: dict[str, list[T]] = {}
    dropped = 0
    encoded: dict[int, T | None] = {}  # by record: a weighted mix repeats records
    for name, records in (("train", train), ("eval", held)):
        if not records:
            continue
        for r in records:
            if id(r) not in encoded:
                encoded[id(r)] = encode(encoder, r)
        kept = [s for s in (encoded[id(r)] for r in records) if s is not None]
        dropped += len(records) - len(kept)
        if len(kept) < len(records):
            log_rank_0(
                f"sft.truncate: dropped {len(records) - len(kept)} of {len(records)} {name} "
                f"records, which keep no token to train on once cut to sft.seq_length "
                f"{cfg.seq_length}", logging.WARNING,
            )  # fmt: skip
        if not kept:
            raise cfg.error(
                "truncate",
                f"truncation to seq_length {cfg.seq_length} leaves no {name} {what}",
            )
        splits[name] = kept
    return tokenizer, pad or 0, splits, dropped


def build_sft_data(cfg: SFTConfig, tokenizer: Any | None = None) -> SFTData:
    """Read, check, tokenize and pack `sft.train` (and `sft.eval`, or the eval_fraction split).
    `tokenizer`: an HF tokenizer to use instead of loading `sft.tokenizer`."""
    tokenizer, pad, splits, dropped = encode_splits(
        cfg, tokenizer, lambda e, r: check_length(e.encode(r), cfg),
        "sample with tokens to train on",
    )  # fmt: skip
    built = {
        name: SFTDataset(samples, cfg.seq_length, cfg.packing, pad, cfg.seed)
        for name, samples in splits.items()
    }
    return SFTData(built["train"], built.get("eval"), tokenizer, dropped)
