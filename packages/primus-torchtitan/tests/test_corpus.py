"""TorchTitan on a prepared corpus (`dataloader.dataset: indexed`): each data-parallel rank
reads its slice of each step's samples (core's `CorpusSamples`, Megatron's order), a resumed
loader goes on where it stopped, and a corpus that is missing or tokenized wider than the model
is refused before TorchTitan is imported. Training on it beside Megatron:
tests/test_corpus_parity.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from primus.core.data.indexed import IndexedCorpus
from primus.core.data.samples import CorpusSamples
from primus.testing.corpus import prepared_reverse_task
from primus.testing.runs import refused
from primus.testing.sft_runs import REPO

TINY = REPO / "configs" / "torchtitan" / "tiny-cpu.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 reverse-task texts prepared with the shipped tokenizer (vocabulary 61)."""
    return prepared_reverse_task(tmp_path_factory.mktemp("corpus") / "c", 300, 2, 30)


def test_each_rank_reads_its_slice_of_each_steps_samples(corpus: Path) -> None:
    from primus.backends.torchtitan.data.corpus import CorpusRows

    samples = CorpusSamples(IndexedCorpus(corpus), 16, 40, seed=9)
    ranks = [CorpusRows(samples, 8, rank, 2) for rank in (0, 1)]
    read = [list(itertools.islice(iter(rows), 12)) for rows in ranks]  # 3 steps of 4 each
    for step in range(3):
        mine = [read[r][step * 4 : step * 4 + 4] for r in (0, 1)]
        rows = [torch_row(inputs, labels) for part in mine for inputs, labels in part]
        for k, row in enumerate(rows):
            assert np.array_equal(row, samples[step * 8 + k]), (step, k)
    resumed = CorpusRows(samples, 8, 1, 2)
    resumed.load_state_dict(ranks[1].state_dict())
    inputs, labels = next(iter(resumed))
    assert np.array_equal(torch_row(inputs, labels), samples[3 * 8 + 4])  # step 4, rank 1's first
    assert inputs["positions"].tolist() == list(range(16))


def test_a_resume_whose_sample_order_changed_is_refused(corpus: Path) -> None:
    """The loader's state (in the checkpoint) keeps the order it read: a resume whose schedule
    spans the same epochs reads on, one whose order changed (more epochs, another seed) is a
    config error naming what sizes the schedule. (Through a DCP checkpoint, with
    `training.steps` raised into a third epoch: the same message, exit 2, checked by hand.)"""
    from primus.backends.torchtitan.data.corpus import CorpusRows
    from primus.core.errors import ConfigError

    def rows(samples: int, seed: int = 9) -> CorpusRows:
        return CorpusRows(CorpusSamples(IndexedCorpus(corpus), 16, samples, seed), 8, 0, 1)

    saved = rows(40)
    next(iter(saved))
    state = saved.state_dict()
    rows(48).load_state_dict(state)  # a longer schedule within the first epoch
    for changed in (rows(40 * len(saved.samples)), rows(40, seed=10)):
        with pytest.raises(ConfigError, match="drew its samples in another order") as refusal:
            changed.load_state_dict(state)
        assert "(training.steps, training.global_batch_size)" in str(refusal.value)
    older = rows(40)  # a checkpoint that kept no order: read on
    older.load_state_dict({"read": 1})
    assert older.read == 1


def torch_row(inputs: dict, labels: object) -> np.ndarray:
    """A (inputs, labels) row back as the sample's seq_len + 1 tokens."""
    return np.concatenate([inputs["input"].numpy(), labels.numpy()[-1:]])  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("prefix", "extra", "said"),
    [
        ("missing", (), "dataloader.dataset_path: the index file "),
        ("c", ("model.vocab_size=32",), "was tokenized with a vocabulary of 61"),
    ],
    ids=["missing", "wider than the model"],
)
def test_a_corpus_that_cannot_be_read_is_refused_at_its_key(
    corpus: Path, tmp_path: Path, prefix: str, extra: tuple[str, ...], said: str
) -> None:
    stderr = refused(
        tmp_path, "validate", TINY, "mock_data=false", "dataloader.dataset=indexed",
        f"dataloader.dataset_path={corpus.parent / prefix}", *extra,
    )  # fmt: skip
    assert said in stderr, stderr[-2000:]


def test_the_data_section_is_the_indexed_dataloader(corpus: Path) -> None:
    """`data:` becomes the dataloader's keys and training.seq_len, each with the line (here
    the override) that set it as origin; the recipe's mock data is replaced."""
    from primus.core.runtime.resolution import load

    overrides = [f"data.path={corpus}", "data.seq_length=16", "data.seed=5"]
    experiment = load(TINY, overrides)
    tree = experiment.modules["pre_trainer"].tree
    for key, value, said in (
        ("dataloader.dataset", "indexed", overrides[0]),
        ("dataloader.dataset_path", str(corpus), overrides[0]),
        ("dataloader.seed", 5, overrides[2]),
        ("training.seq_len", 16, overrides[1]),
        ("mock_data", False, overrides[0]),
    ):
        path = tuple(key.split("."))
        assert (tree.get(path), str(tree.origin(path))) == (value, f"cli ({said})"), key
    assert any("mock_data True is replaced by False from data.path" in n for n in experiment.notes)
    blend = f"data.path=[{{path: {corpus}, weight: 1}}, {{path: {corpus}-b, weight: 3}}]"
    tree = load(TINY, [blend]).modules["pre_trainer"].tree
    expected = [{"path": str(corpus), "weight": 1.0}, {"path": f"{corpus}-b", "weight": 3.0}]
    assert tree.get(("dataloader", "blend")) == expected


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("data.path=missing/c",), "cli (data.path=missing/c): data.path: the index file"),
        (
            ("data.path=[{path: {corpus}, weight: 1}, {path: b/c, weight: 1}]",),
            "data.path: the index file",
        ),
        (
            ("data.path={corpus}", "data.seq_length=16", "training.seq_len=32"),
            "data.seq_length sets training.seq_len to 16, and cli (training.seq_len=32) sets "
            "it to 32",
        ),
        (
            ("data.path={corpus}", "--stage", "posttrain"),
            "data: is the corpus pretraining reads; posttrain reads sft:",
        ),
    ],
    ids=["missing", "missing in a blend", "set twice", "posttrain"],
)
def test_a_data_section_torchtitan_cannot_read_is_refused(
    corpus: Path, tmp_path: Path, args: tuple[str, ...], said: str
) -> None:
    stderr = refused(
        tmp_path, "validate", TINY, *(a.replace("{corpus}", str(corpus)) for a in args)
    )
    assert said in stderr, stderr[-2000:]
