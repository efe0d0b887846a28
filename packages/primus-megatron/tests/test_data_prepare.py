"""A corpus from core's `primus data prepare` is what megatron-core writes and reads: the bytes
of its IndexedDatasetBuilder for the same tokens, its IndexedDataset reads it, and the
manifest's vocabulary size and end-of-document id give its NullTokenizer that id."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from primus.backends.megatron.data.inputs import check_data_inputs, corpus_tokenizer
from primus.core.config.experiment import ModuleConfig
from primus.core.config.tree import ConfigTree
from primus.core.data.manifest import read_manifest
from primus.core.data.prepare import Request, prepare
from primus.core.errors import ConfigError
from primus.testing.corpus import corpus_texts, expected_documents, tokenizer_dir, write_jsonl


def test_megatron_reads_and_would_have_written_the_same_corpus(tmp_path: Path) -> None:
    tokenizer = tokenizer_dir(tmp_path / "tokenizer")
    texts = corpus_texts(300)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", texts)
    prefix = tmp_path / "out" / "corpus"
    prepare(Request([str(corpus)], tokenizer, prefix, workers=2, chunk_bytes=2048))
    manifest = read_manifest(prefix)
    assert manifest is not None
    eod, vocab = manifest["eod"]["id"], manifest["vocab_size"]
    # Megatron's checks pass the corpus named without a tokenizer, read with a NullTokenizer and
    # the manifest's end-of-document id (megatron.corpus_tokenizer sets them); a vocab_size too
    # small for it is refused, naming the manifest's.
    module = ModuleConfig("m", "megatron", {"data_path": [str(prefix)]}, ConfigTree())
    check_data_inputs(module)
    assert corpus_tokenizer(module.params) == {
        "tokenizer_type": "NullTokenizer", "null_tokenizer_eod_id": eod,
    }  # fmt: skip
    module.params["vocab_size"] = vocab - 1
    with pytest.raises(ConfigError) as refused:
        check_data_inputs(module)
    params = f"tokenizer_type=NullTokenizer vocab_size={vocab} null_tokenizer_eod_id={eod}"
    assert f"(its manifest {prefix}.json): set {params}" in (refused.value.hint or "")

    from primus.backends.megatron.config.bridge import silence_import_notices

    silence_import_notices()  # imported after the prepare: its workers fork a process without torch
    from megatron.core.datasets import indexed_dataset
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    documents = expected_documents(tokenizer, texts, eod)
    builder = indexed_dataset.IndexedDatasetBuilder(str(tmp_path / "ref.bin"), dtype=np.uint16)
    for ids in documents:
        builder.add_document(ids, [len(ids)])
    builder.finalize(str(tmp_path / "ref.idx"))
    for suffix in (".bin", ".idx"):
        assert (
            prefix.with_suffix(suffix).read_bytes()
            == (tmp_path / "ref").with_suffix(suffix).read_bytes()
        )

    dataset = indexed_dataset.IndexedDataset(str(prefix))
    assert [dataset[i].tolist() for i in range(len(dataset))] == documents
    assert dataset.document_indices.tolist() == list(range(len(documents) + 1))
    null = build_tokenizer(
        SimpleNamespace(
            tokenizer_type="NullTokenizer", vocab_size=vocab, null_tokenizer_eod_id=eod,
            pad_vocab_size=False,
        )
    )  # fmt: skip
    assert (null.eod, null.vocab_size) == (eod, vocab)


def test_megatron_trains_on_a_prepared_corpus_named_without_a_tokenizer(tmp_path: Path) -> None:
    """Prepare a corpus, then train the tiny recipe on it naming only the corpus: the manifest
    gives the NullTokenizer's end-of-document id (megatron.corpus_tokenizer); on the data (no
    mock data), the loss falls."""
    import json

    from primus.testing.runs import train_run

    texts = corpus_texts(600, seed=3)
    prefix = tmp_path / "data" / "corpus"
    tokenizer = tokenizer_dir(tmp_path / "tokenizer")
    prepare(Request([str(write_jsonl(tmp_path / "corpus.jsonl", texts))], tokenizer, prefix))
    manifest = read_manifest(prefix)
    assert manifest is not None
    recipe = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
    run_dir = train_run(
        recipe, tmp_path / "ws", f"data_path=[{prefix}]",
        "exp_name=on-data", "train_iters=15", "split=100,0,0",  # a few dozen samples: all train
    )  # fmt: skip
    report = {
        p["id"]: p for p in json.loads((run_dir / "patch_report.json").read_text())["patches"]
    }
    assert report["megatron.mock_data"]["status"] == "skipped"  # it trained on the data
    tokenizer_patch = report["megatron.corpus_tokenizer"]
    assert tokenizer_patch["status"] == "applied"
    set_params = {change["key"]: change["value"] for change in tokenizer_patch["params_set"]}
    assert set_params == {
        "tokenizer_type": "NullTokenizer", "null_tokenizer_eod_id": manifest["eod"]["id"],
    }  # fmt: skip
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1]["step"] == 15 and steps[-1]["loss"] < steps[0]["loss"] - 0.5
