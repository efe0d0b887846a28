"""Preference training (DPO) without a framework: the pairs a backend trains on, and the loss.

Each preference record is two samples, the prompt with the chosen answer and with the
rejected one, tokenized as fine-tuning tokenizes (`primus.core.posttrain.encode`); one
sample per row, never packed. A pair row holds the two sides stacked: every key of
`primus.core.posttrain.dataset`'s rows with a leading axis of 2 (0: chosen, 1: rejected).
Positions and their order over epochs are those of fine-tuning's rows, counted in pairs.

The loss of a pair (Rafailov et al. 2023, with conservative DPO's label smoothing e), where
log p is the sum of a side's log-probabilities over its loss mask, under the policy and
under the frozen reference (the run's initial weights):

    r_chosen   = beta * (log p_policy(chosen)   - log p_reference(chosen))
    r_rejected = beta * (log p_policy(rejected) - log p_reference(rejected))
    loss       = -(1 - e) * log sigmoid(r_chosen - r_rejected) - e * log sigmoid(r_rejected - r_chosen)

averaged over the pairs of the global batch. Logged beside it: the mean rewards, the mean
margin r_chosen - r_rejected, and the share of pairs whose margin is positive.

Eval: the same loss and reward metrics (EVAL_METRICS: `eval_loss`, `eval_reward_margin`, ...)
over every eval pair once, the policy in eval mode: a backend adds up `dpo_eval_sums_torch`
over its batches and data-parallel ranks (padding pairs outside the sums), then divides
(`dpo_eval_metrics`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from primus.core.config.posttrain import DPOConfig, SFTConfig
from primus.core.posttrain.dataset import ROW_KEYS, Row, SFTDataset, encode_splits
from primus.core.posttrain.encode import Encoder, Sample, check_length
from primus.core.posttrain.records import Record

PAIR_KEYS = ROW_KEYS[:-1]  # one sample per row: no cu_seqlens
REFERENCE_KEY = "reference_logps"  # a row's precomputed reference log-probabilities
# the step metrics DPO adds, each a mean over the global batch's pairs
REWARD_METRICS = ("reward_chosen", "reward_rejected", "reward_margin", "reward_accuracy")
# the eval's step metrics, each a mean over the eval pairs
EVAL_METRICS = ("eval_loss", *(f"eval_{name}" for name in REWARD_METRICS))


class PairDataset:
    """The pairs' rows: `chosen` and `rejected` hold one sample per row, row i of each the
    two sides of pair i. Once `reference` is set (`dpo.precompute_reference`: the reference's
    summed log-probabilities of every pair, (pairs, 2) float32), each row also holds its
    pair's under REFERENCE_KEY (2,)."""

    def __init__(self, chosen: SFTDataset, rejected: SFTDataset) -> None:
        assert len(chosen) == len(rejected)
        self.chosen, self.rejected = chosen, rejected
        self.seq_length = chosen.seq_length
        self.reference: Any = None

    def __len__(self) -> int:
        return len(self.chosen)

    def __getitem__(self, index: int) -> Row:
        """Pair `index` of the unshuffled pairs: each key (2, seq_length)."""
        import numpy as np

        sides = self.chosen[index], self.rejected[index]
        row = {k: np.stack([side[k] for side in sides]) for k in PAIR_KEYS}
        if self.reference is not None:
            row[REFERENCE_KEY] = self.reference[index]
        return row

    def set_reference(self, logps: Any) -> None:
        """Every pair's reference log-probabilities, (pairs, 2): chosen, rejected."""
        import numpy as np

        table = np.asarray(logps, dtype=np.float32)
        assert table.shape == (len(self), 2), f"{table.shape} for {len(self)} pairs"
        self.reference = table

    def row(self, position: int) -> Row:
        """The pair at `position` (counted from the start of training, over epochs)."""
        epoch, index = divmod(position, len(self))
        return self[self.chosen.order(epoch)[index]]

    def batch(self, start: int, size: int) -> Row:
        """Pairs at positions start .. start + size - 1: each key (size, 2, seq_length)."""
        import numpy as np

        rows = [self.row(p) for p in range(start, start + size)]
        return {k: np.stack([r[k] for r in rows]) for k in rows[0]}

    def describe(self) -> str:
        tokens = self.chosen.loss_tokens + self.rejected.loss_tokens
        return (
            f"{len(self)} preference pairs in rows of {self.seq_length}, "
            f"{tokens} answer tokens in the loss"
        )


@dataclass
class PairData:
    """What `build_pair_data` returns: the train and eval pairs, the tokenizer, and how many
    pairs truncation left with nothing to train on (dropped)."""

    train: PairDataset
    eval: PairDataset | None
    tokenizer: Any
    dropped: int = 0


def _encode(encoder: Encoder, record: Record, cfg: SFTConfig) -> tuple[Sample, Sample] | None:
    """A record's two samples, each checked (`check_length`); refused where they are the same
    tokens (answers that differ only where the template or the tokenizer does not look)."""
    chosen, rejected = (encoder.encode(side) for side in record.sides())
    if chosen.tokens == rejected.tokens:
        raise record.error(
            "'chosen' and 'rejected' are the same tokens once rendered and tokenized",
            hint="a pair teaches nothing unless its answers differ",
        )
    cut = (check_length(chosen, cfg, "the chosen answer's "),
           check_length(rejected, cfg, "the rejected answer's "))  # fmt: skip
    return None if cut[0] is None or cut[1] is None else (cut[0], cut[1])


def build_pair_data(cfg: SFTConfig, tokenizer: Any | None = None) -> PairData:
    """Read, check and tokenize the `sft:` section's preference records (the module's `sft`
    once `dpo:` is set: format preference, packing off). `tokenizer`: an HF tokenizer to use
    instead of loading `sft.tokenizer`."""
    tokenizer, pad, splits, dropped = encode_splits(
        cfg, tokenizer, lambda e, r: _encode(e, r, cfg), "pair with answer tokens on both sides"
    )
    built = {
        name: PairDataset(*(
            SFTDataset([p[side] for p in pairs], cfg.seq_length, False, pad, cfg.seed)
            for side in (0, 1)
        ))
        for name, pairs in splits.items()
    }  # fmt: skip
    return PairData(built["train"], built.get("eval"), tokenizer, dropped)


def _pair_terms(policy: Any, reference: Any, dpo: DPOConfig) -> tuple[Any, Any, Any]:
    """Each pair's loss, rewards (pairs, 2) and margin."""
    import torch.nn.functional as F

    rewards = dpo.beta * (policy - reference.detach())
    margin = rewards[:, 0] - rewards[:, 1]
    e = dpo.label_smoothing
    return -(1 - e) * F.logsigmoid(margin) - e * F.logsigmoid(-margin), rewards, margin


def dpo_loss_torch(policy: Any, reference: Any, dpo: DPOConfig) -> tuple[Any, dict[str, Any]]:
    """The DPO loss of a batch of pairs and its reward metrics, from the sides' summed
    log-probabilities: `policy` and `reference` (pairs, 2), column 0 chosen, 1 rejected.
    Returns the mean loss over the pairs (a tensor with the policy's gradient) and each of
    REWARD_METRICS as a detached mean. Imports torch."""
    losses, rewards, margin = _pair_terms(policy, reference, dpo)
    metrics = {
        "reward_chosen": rewards[:, 0].detach().mean(),
        "reward_rejected": rewards[:, 1].detach().mean(),
        "reward_margin": margin.detach().mean(),
        "reward_accuracy": (margin.detach() > 0).float().mean(),
    }
    return losses.mean(), metrics


def dpo_eval_sums_torch(policy: Any, reference: Any, valid: Any, dpo: DPOConfig) -> Any:
    """The eval sums of a batch of pairs as one float64 tensor, ready for one all-reduce: the
    loss and each reward metric summed over the pairs where `valid` (pairs,) is true (not
    padding), then their count. `policy`, `reference` as `dpo_loss_torch` takes them.
    Imports torch."""
    import torch

    losses, rewards, margin = _pair_terms(policy.detach().double(), reference.double(), dpo)
    weight = valid.double()
    columns = (losses, rewards[:, 0], rewards[:, 1], margin, (margin > 0).double())
    return torch.stack([*((column * weight).sum() for column in columns), weight.sum()])


def dpo_eval_metrics(sums: list[float]) -> dict[str, float]:
    """EVAL_METRICS from the sums of `dpo_eval_sums_torch` added up over the eval set."""
    *totals, pairs = sums
    return {name: total / pairs if pairs else math.nan
            for name, total in zip(EVAL_METRICS, totals, strict=True)}  # fmt: skip


def sequence_logps_torch(logits: Any, labels: Any, loss_mask: Any) -> Any:
    """Each row's summed log-probability of its labels over its loss mask, in float32:
    logits (..., seq, vocab), labels and loss_mask (..., seq) -> (...). Imports torch."""
    import torch

    logps = torch.log_softmax(logits.float(), dim=-1)
    token = logps.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return (token * loss_mask.float()).sum(-1)
