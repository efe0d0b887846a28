"""MaxText on a prepared corpus (`dataset_type: indexed`): each process loads its share of each
step's samples (core's `CorpusSamples`, Megatron's order) as MaxText batches, from the step a
run starts at, and a corpus that is missing, tokenized wider than the model or asked to evaluate
is refused before JAX is imported. Training on it beside Megatron, stopped half-way and resumed:
tests/test_corpus_parity.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from primus.core.data.indexed import IndexedCorpus
from primus.core.data.samples import CorpusSamples
from primus.testing.corpus import prepared_reverse_task
from primus.testing.runs import refused

RECIPES = Path(__file__).resolve().parents[3] / "configs" / "maxtext"
TINY = RECIPES / "tiny-cpu.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 reverse-task texts prepared with the shipped tokenizer (vocabulary 61)."""
    return prepared_reverse_task(tmp_path_factory.mktemp("corpus") / "c", 300, 2, 30)


def test_each_process_loads_its_share_of_each_steps_samples(corpus: Path, tmp_path: Path) -> None:
    """Two processes from step 2 (a run resumed there): process p loads rows 4p .. 4p + 3 of the
    step's 8 samples; a sample's first 16 tokens are the inputs, its last 16 the targets, all
    in the loss, at positions 0 .. 15 of one segment."""
    from primus.backends.maxtext.data.corpus import CorpusRows

    samples = CorpusSamples(IndexedCorpus(corpus), 16, 40, seed=9)
    halves = [CorpusRows(samples, 8, process, 2, tmp_path) for process in (0, 1)]
    for half in halves:
        half.start = 2
    loaders = [iter(half) for half in halves]
    for step in (2, 3):
        parts = [next(loader) for loader in loaders]
        batch = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
        rows = np.stack([samples[step * 8 + k] for k in range(8)])
        assert np.array_equal(batch["inputs"], rows[:, :-1]), step
        assert np.array_equal(batch["targets"], rows[:, 1:]), step
        for key in ("inputs_position", "targets_position"):
            assert (batch[key] == np.arange(16)).all(), key
        for key in ("inputs_segmentation", "targets_segmentation"):
            assert (batch[key] == 1).all(), key
        assert all(value.dtype == np.int32 for value in batch.values())


def test_a_resume_whose_sample_order_changed_is_refused(corpus: Path, tmp_path: Path) -> None:
    """The run directory keeps the order a run started with (process 0 writes it); a resume
    whose schedule spans the same epochs keeps the order and goes on, one that spans more
    (the samples drawn in another order) is a config error naming what sizes the schedule."""
    from primus.backends.maxtext.data.corpus import CorpusRows
    from primus.core.errors import ConfigError

    def rows(samples: int, process: int = 0) -> CorpusRows:
        drawn = CorpusSamples(IndexedCorpus(corpus), 16, samples, seed=9)
        return CorpusRows(drawn, 8, process, 2, tmp_path)

    rows(40).starting(0)
    assert (tmp_path / "data_order.json").is_file()
    rows(48).starting(3)  # a longer schedule within the first epoch: the same order
    epochs = 40 * len(rows(40).samples)
    longer = rows(epochs)  # several epochs: another order
    assert longer.samples.epochs > 1
    with pytest.raises(ConfigError) as refusal:
        longer.starting(3)
    assert "drew its samples in another order (c.bin: 1 epoch, sequence 16, seed 9)" in str(
        refusal.value
    )
    assert "(steps, per_device_batch_size)" in str(refusal.value)
    longer.starting(0)  # a fresh run starts the order anew
    rows(epochs, process=1).starting(3)  # checked against what process 0 kept
    with pytest.raises(ConfigError):
        rows(40, process=1).starting(3)
    (tmp_path / "data_order.json").write_text("{edited")  # unreadable: kept anew, not a crash
    rows(40).starting(3)
    rows(40, process=1).starting(4)


@pytest.mark.parametrize(
    ("prefix", "extra", "said"),
    [
        ("missing", (), "dataset_path: the index file "),
        ("c", ("vocab_size=32",), "was tokenized with a vocabulary of 61"),
        ("c", ("eval_interval=5",), "a prepared corpus (dataset_type: indexed) is read for "),
    ],
    ids=["missing", "wider than the model", "evaluated"],
)
def test_a_corpus_that_cannot_be_read_is_refused_at_its_key(
    corpus: Path, tmp_path: Path, prefix: str, extra: tuple[str, ...], said: str
) -> None:
    stderr = refused(
        tmp_path, "validate", TINY, "dataset_type=indexed",
        f"dataset_path={corpus.parent / prefix}", *extra,
    )  # fmt: skip
    assert said in stderr, stderr[-2000:]


def test_the_data_section_is_maxtexts_indexed_dataset(corpus: Path, tmp_path: Path) -> None:
    """`data:` becomes dataset_type indexed, dataset_path (dataset_blend for several corpora),
    data_shuffle_seed and max_target_length, each with the line that set it as origin; an
    eval asked for beside it is refused, not dropped."""
    from primus.core.runtime.resolution import load

    overrides = [f"data.path={corpus}", "data.seq_length=16", "data.seed=5"]
    tree = load(TINY, overrides).modules["pre_trainer"].tree
    for key, value, said in (
        ("dataset_type", "indexed", overrides[0]),
        ("dataset_path", str(corpus), overrides[0]),
        ("data_shuffle_seed", 5, overrides[2]),
        ("max_target_length", 16, overrides[1]),
    ):
        assert (tree.get((key,)), str(tree.origin((key,)))) == (value, f"cli ({said})"), key
    blend = f"data.path=[{{path: {corpus}, weight: 2}}, {{path: {corpus}-b, weight: 1}}]"
    tree = load(TINY, [blend]).modules["pre_trainer"].tree
    expected = [{"path": str(corpus), "weight": 2.0}, {"path": f"{corpus}-b", "weight": 1.0}]
    assert tree.get(("dataset_blend",)) == expected
    stderr = refused(tmp_path, "validate", TINY, blend)
    assert f"data.path: the index file {corpus}-b.idx does not exist" in stderr
    stderr = refused(tmp_path, "validate", TINY, f"data.path={corpus}", "eval_interval=5")
    assert "cli (eval_interval=5): eval_interval: 5 evaluates, and a prepared corpus" in stderr
