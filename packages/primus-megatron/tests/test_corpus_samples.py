"""Core's reading of a prepared corpus draws megatron-core's samples: `CorpusSamples` against
megatron-core's own GPTDataset (built by its BlendedMegatronDatasetBuilder, as Megatron's
pretraining builds it) on the same corpus, sample for sample, within one epoch, over several,
and with the last epoch shuffled apart."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from primus.core.data.indexed import IndexedCorpus
from primus.core.data.samples import CorpusSamples


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 documents of 5 to 120 random tokens, written by megatron-core's builder."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    prefix = tmp_path_factory.mktemp("corpus") / "docs"
    rng = np.random.default_rng(0)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.int32)
    for _ in range(300):
        doc = rng.integers(0, 1000, rng.integers(5, 120))
        builder.add_document(doc, [len(doc)])
    builder.finalize(f"{prefix}.idx")
    return prefix


def megatron_samples(prefix: Path, seq_length: int, count: int, seed: int, cache: Path) -> list:
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    tokenizer = SimpleNamespace(eod=0, pad=0, unique_identifiers={"class": "null"}, vocab_size=1000)
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length, blend=([str(prefix)], None),
        split="100,0,0", path_to_cache=str(cache), tokenizer=tokenizer,  # type: ignore[arg-type]
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
    )  # fmt: skip
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset, [count, None, None], lambda: True, config
    ).build()
    return [train._query_document_sample_shuffle_indices(i)[0] for i in range(count)]


@pytest.mark.parametrize(
    ("seq_length", "count", "seed", "epochs", "apart"),
    [(64, 100, 1234, 1, False), (32, 1650, 7, 3, False), (50, 950, 3, 3, True)],
    ids=["one epoch", "epochs shuffled together", "the last epoch apart"],
)
def test_every_sample_is_megatrons(
    corpus: Path, tmp_path: Path, seq_length: int, count: int, seed: int, epochs: int, apart: bool
) -> None:
    ours = CorpusSamples(IndexedCorpus(corpus), seq_length, count, seed)
    assert (ours.epochs, ours.last_epoch_apart) == (epochs, apart), ours.describe()
    assert len(ours) == (epochs * IndexedCorpus(corpus).token_count - 1) // seq_length
    theirs = megatron_samples(corpus, seq_length, count, seed, tmp_path)
    assert len(theirs) == count
    for i, sample in enumerate(theirs):
        assert np.array_equal(ours[i], sample), i


def test_the_data_section_is_megatrons_blend_split_seed_and_sequence(tmp_path: Path) -> None:
    """`data:` becomes data_path (a blend as [weight, prefix, ...]), the whole corpus for
    training, the seed and seq_length, each with the line that set it as origin."""
    from primus.core.runtime.resolution import load

    recipe = Path(__file__).parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
    blend = f"data.path=[{{path: {tmp_path}/a, weight: 0.3}}, {{path: {tmp_path}/b, weight: 0.7}}]"
    overrides = [blend, "data.seq_length=48", "data.seed=9"]
    tree = load(recipe, overrides).modules["pre_trainer"].tree
    for key, value, said in (
        ("data_path", ["0.3", f"{tmp_path}/a", "0.7", f"{tmp_path}/b"], overrides[0]),
        ("split", "100,0,0", overrides[0]),
        ("mock_data", False, overrides[0]),
        ("seed", 9, overrides[2]),
        ("seq_length", 48, overrides[1]),
    ):
        assert (tree.get((key,)), str(tree.origin((key,)))) == (value, f"cli ({said})"), key
