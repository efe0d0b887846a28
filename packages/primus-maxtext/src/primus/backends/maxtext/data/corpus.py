"""Pretraining on a prepared corpus (`primus data prepare`): `dataset_type: indexed` with
`dataset_path: PREFIX` reads PREFIX.bin/.idx through core's `CorpusSamples` (`dataset_blend`
several, through `BlendedSamples`), so MaxText trains on the samples Megatron draws from the same
corpus (or blend) with the same seed (`data_shuffle_seed`; unset,
1234, Megatron's default `seed`), sequence length (`max_target_length`) and global batch: step s
reads samples s * G .. s * G + G - 1 (G the global batch), each process its share
(`primus.backends.maxtext.data.rows`). A sample of L + 1 tokens is one row: inputs its first L,
targets its last L, every target in the loss, positions 0 .. L - 1, one segment (no document
masking), as Megatron's defaults have them. A resumed run reads from its step's samples on.

MaxText's config knows no `dataset_type: indexed`: the patch `maxtext.corpus` gives it
`synthetic` (which reads no files), and `maxtext.corpus_data` replaces the batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.backends.maxtext.data.inputs import INDEXED
from primus.backends.maxtext.data.rows import GlobalRows, feed, loaded_batch, maxtext_batch
from primus.backends.maxtext.maxtext_adapter import TESTED
from primus.core.logging import log_rank_0
from primus.core.patches import PatchContext, get_param, register_patch

SEED = 1234  # the sample order's seed unless data_shuffle_seed is set: Megatron's default seed


class CorpusRows(GlobalRows):
    """This process's share of every training batch of a corpus's samples (`CorpusSamples`)."""

    what = "corpus samples"

    def __init__(
        self, samples: Any, global_batch: int, process: int, processes: int, run_dir: Path
    ) -> None:
        super().__init__(global_batch, process, processes)
        self.samples, self.run_dir, self.writer = samples, run_dir, process == 0

    def starting(self, step: int) -> None:
        """A resumed run's sample order is the one its run directory keeps (MaxText's
        checkpoint holds no data position: the step is the position)."""
        from primus.core.data.order import check_run_order

        keys = "steps, per_device_batch_size"
        check_run_order(self.run_dir, self.samples.order_settings(), step, keys, self.writer)

    def batch(self, first: int, count: int) -> dict[str, Any]:
        import numpy as np

        tokens = np.stack([self.samples[(first + i) % len(self.samples)] for i in range(count)])
        length = tokens.shape[1] - 1
        ones = np.ones((count, length), np.int32)
        return maxtext_batch(
            {
                "tokens": tokens[:, :-1],
                "labels": tokens[:, 1:],
                "loss_mask": ones,
                "position_ids": np.broadcast_to(np.arange(length, dtype=np.int32), ones.shape),
                "segment_ids": ones,
            }
        )


def _indexed(ctx: PatchContext) -> bool:
    """dataset_type is indexed (a prepared corpus) and the stage is pretrain"""
    return get_param(ctx, "dataset_type") == INDEXED and ctx.stage == "pretrain"


@register_patch(
    "maxtext.corpus",
    backend="maxtext",
    phase="setup",
    condition=_indexed,
    backend_versions=TESTED,
    target="MaxText config dataset_type, packing, data_shuffle_seed",
    tags=("data",),
)
def corpus(ctx: PatchContext) -> None:
    """Pretrain on the prepared corpus `dataset_path` (maxtext.corpus_data): MaxText's own
    pipeline reads nothing (dataset_type synthetic, no packing), and the samples' order is
    that of Megatron's default seed unless data_shuffle_seed is set."""
    ctx.set_param(
        "dataset_type", "synthetic", "MaxText knows no 'indexed': maxtext.corpus_data feeds the "
        "corpus's samples to its loop, its own pipeline reads nothing",
    )  # fmt: skip
    ctx.set_param("packing", False, "a corpus sample is one row: nothing to pack")
    if get_param(ctx, "data_shuffle_seed") is None:
        ctx.set_param("data_shuffle_seed", SEED, "the corpus's sample order: Megatron's seed")


@register_patch(
    "maxtext.corpus_data",
    backend="maxtext",
    phase="before_train",
    requires="maxtext.corpus",
    backend_versions=TESTED,
    target="maxtext.input_pipeline.input_pipeline_interface.create_data_iterator, "
    "maxtext.trainers.pre_train.train.get_first_step",
    tags=("data",),
)
def corpus_data(ctx: PatchContext) -> None:
    """MaxText's training loop reads the corpus's samples in Megatron's order by global
    position (each process its share of every global batch, a resumed run from its step)."""
    import jax

    from primus.core.data.blend import training_samples

    trainer = ctx.extra["trainer"]
    config = trainer.config
    batch = loaded_batch(config, "a prepared corpus")
    blend = get_param(ctx, "dataset_blend") or [{"path": config.dataset_path, "weight": None}]
    corpora = [(str(Path(c["path"]).expanduser()), c["weight"]) for c in blend]
    samples = training_samples(
        corpora, config.max_target_length, config.steps * batch, config.data_shuffle_seed
    )
    log_rank_0(f"[maxtext] data: {samples.describe()}")
    assert ctx.run_dir is not None, "a training run has its directory"
    rows = CorpusRows(samples, batch, jax.process_index(), jax.process_count(), ctx.run_dir)
    feed(ctx, rows)
    trainer.corpus_rows = rows
