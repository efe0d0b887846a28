"""Core's reading of a prepared corpus draws megatron-core's samples: `CorpusSamples` against
megatron-core's own GPTDataset (built by its BlendedMegatronDatasetBuilder, as Megatron's
pretraining builds it) on the same corpus, sample for sample, within one epoch, over several,
and with the last epoch shuffled apart."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from primus.core.data.blend import training_samples
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


def megatron_samples(
    prefix: Path | list, seq_length: int, count: int, seed: int, cache: Path
) -> list:
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    tokenizer = SimpleNamespace(eod=0, pad=0, unique_identifiers={"class": "null"}, vocab_size=1000)
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq_length,
        blend=get_blend_from_list(prefix if isinstance(prefix, list) else [str(prefix)]),
        split="100,0,0", path_to_cache=str(cache), tokenizer=tokenizer,  # type: ignore[arg-type]
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
    )  # fmt: skip
    train, _, _ = BlendedMegatronDatasetBuilder(
        GPTDataset,
        [count, 1, 1],
        lambda: True,
        config,  # splits 2 and 3 are empty
    ).build()
    if isinstance(prefix, list):  # a BlendedDataset: each sample one of its GPTDatasets'
        parts, which, number = train.datasets, train.dataset_index, train.dataset_sample_index
        return [
            parts[which[i]]._query_document_sample_shuffle_indices(number[i])[0]
            for i in range(len(train))
        ]
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


def test_a_blend_draws_megatrons_samples(corpus: Path, tmp_path: Path) -> None:
    """Three corpora (two small) blended 5:3:2: every sample of megatron-core's
    BlendedDataset, in its order, over several epochs of the small corpora."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    smalls = [tmp_path / "small-a", tmp_path / "small-b"]
    for seed, small in enumerate(smalls):
        builder = IndexedDatasetBuilder(f"{small}.bin", dtype=np.int32)
        for doc in np.random.default_rng(seed).integers(0, 1000, (40, 30)):
            builder.add_document(doc, [len(doc)])
        builder.finalize(f"{small}.idx")
    corpora = [(str(corpus), 5.0), (str(smalls[0]), 3.0), (str(smalls[1]), 2.0)]
    ours = training_samples(corpora, 32, 700, 11)
    blend = [item for prefix, weight in corpora for item in (str(weight), prefix)]
    theirs = megatron_samples(blend, 32, 700, 11, tmp_path / "cache")
    assert len(ours) == len(theirs) >= 700
    assert ours.parts[1].epochs > 1  # type: ignore[union-attr]
    for i, sample in enumerate(theirs):
        assert np.array_equal(ours[i], sample), i


def test_the_experiments_own_seed_beats_the_data_default_but_not_data_seed(tmp_path: Path) -> None:
    """`seed: 42` beside a `data:` that names no seed is kept (the note says so); beside an
    explicit `data.seed` in the same layer it is an error naming both."""
    from primus.core.errors import ConfigError
    from primus.core.runtime.resolution import load

    recipe = Path(__file__).parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
    experiment = load(recipe, [f"data.path={tmp_path}/a", "seed=42"])
    assert experiment.modules["pre_trainer"].tree.get(("seed",)) == 42
    assert "cli (seed=42): seed 42, set, over the default of data.seed (1234), is kept" in (
        experiment.notes
    )
    with pytest.raises(ConfigError, match=r"data.seed sets seed to 9, and cli \(seed=42\)"):
        load(recipe, [f"data.path={tmp_path}/a", "data.seed=9", "seed=42"])
