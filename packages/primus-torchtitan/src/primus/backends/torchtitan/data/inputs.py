"""The local dataset and tokenizer a TorchTitan module names, checked without importing
TorchTitan: every file `dataloader.dataset_path` matches, each jsonl's first record, and the
tokenizer folder in `hf_assets_path`; or, for a prepared corpus (`dataloader.dataset:
indexed`), its .idx and .bin, and token ids that fit the model's vocabulary."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

from primus.core.config.data_section import DataConfig
from primus.core.config.experiment import ModuleConfig
from primus.core.config.inputs import check_corpus, check_tokenizer_folder, input_path, is_remote
from primus.core.data.manifest import VOCABULARY_HINT, vocabulary_problem

LOCAL_FORMATS = {"jsonl": "json", "parquet": "parquet"}  # dataset name -> HF datasets builder
INDEXED = "indexed"  # the dataset name of a prepared corpus (primus data prepare)
TEXT_FIELD = "text"


def _param(module: ModuleConfig, key: str) -> Any:
    return module.tree.get(tuple(key.split(".")))


def _first_record_problem(path: Path) -> str | None:
    """Why the first record of a jsonl file has no text to train on, or None."""
    with path.open(encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                return f"{path}:{number}: not valid JSON: {exc.msg} (column {exc.colno})"
            if not isinstance(record, dict) or not isinstance(record.get(TEXT_FIELD), str):
                return f"{path}:{number}: a record needs a '{TEXT_FIELD}' string"
            return None
    return f"{path} holds no records"


def check_data_inputs(module: ModuleConfig) -> None:
    """A local dataset (jsonl or parquet) names files that exist and hold text, and a
    tokenizer folder."""
    dataset = _param(module, "dataloader.dataset")
    if _param(module, "mock_data") is True or not isinstance(dataset, str):
        return
    if dataset == INDEXED:
        check_indexed(module)
        return
    if dataset not in LOCAL_FORMATS:
        return
    key = "dataloader.dataset_path"
    pattern = _param(module, key)
    if not pattern:
        raise module.error(key, f"{key}: name the local jsonl/parquet file(s) to read")
    if not is_remote(pattern):  # a URL: the datasets library reads it
        files = sorted(glob.glob(str(Path(str(pattern)).expanduser())))
        if not files:
            input_path(module, key, pattern, "the dataset")  # says what is missing
        for name in files:
            path = input_path(module, key, name, "the dataset file")
            problem = _first_record_problem(path) if path.suffix == ".jsonl" else None
            if problem:
                raise module.error(key, f"{key}: {problem}")
    check_tokenizer_folder(module, "hf_assets_path", _param(module, "hf_assets_path"))


def check_indexed(module: ModuleConfig) -> None:
    """`dataloader.dataset_path` (or each corpus of `dataloader.blend`) names a prepared corpus
    whose vocabulary (its manifest's) fits the model's."""
    key, blend = "dataloader.dataset_path", _param(module, "dataloader.blend")
    prefixes = [_param(module, key)]
    if blend:
        key, prefixes = "dataloader.blend", [item.get("path") for item in blend]
    for prefix in prefixes:
        if not prefix:
            raise module.error(key, f"{key}: name the prepared corpus (PREFIX of PREFIX.bin)")
        check_corpus(module, key, str(prefix))
        problem = vocabulary_problem(str(prefix), _param(module, "model.vocab_size"))
        if problem:
            raise module.error(key, f"{key}: {problem}", VOCABULARY_HINT)


def corpus_params(data: DataConfig) -> dict[str, tuple[Any, str]]:
    """`data:` as TorchTitan's keys: the prepared corpus (`dataloader.dataset_path`) or the
    blend (`dataloader.blend`) read through core's samples (`dataloader.dataset: indexed`),
    its seed, and `training.seq_len`."""
    params: dict[str, tuple[Any, str]] = {
        "dataloader.dataset": (INDEXED, ""),
        "dataloader.seed": (data.seed, "seed"),
        "mock_data": (False, ""),
    }
    params |= data.corpus_keys("dataloader.dataset_path", "dataloader.blend")
    if data.seq_length is not None:
        params["training.seq_len"] = (data.seq_length, "seq_length")
    return params
