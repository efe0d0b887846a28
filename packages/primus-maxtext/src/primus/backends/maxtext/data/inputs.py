"""The data files and tokenizer a MaxText module names, checked without importing MaxText or
JAX: every file `grain_train_files` (and `grain_eval_files`) matches, with the ArrayRecord
signature where they are ArrayRecord files, and a local `tokenizer_path`; or, for a prepared
corpus (`dataset_type: indexed`), its .idx and .bin, and token ids that fit the model's
vocabulary."""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

from primus.core.config.data_section import DataConfig
from primus.core.config.experiment import ModuleConfig
from primus.core.config.inputs import check_corpus, input_path, is_remote
from primus.core.data.manifest import VOCABULARY_HINT, vocabulary_problem

GRAIN_KEYS = ("grain_train_files", "grain_eval_files")
INDEXED = "indexed"  # dataset_type of a prepared corpus (primus data prepare)
# Every ArrayRecord file is a Riegeli file, which starts with these 64 bytes (its signature)
ARRAY_RECORD_SIGNATURE = bytes.fromhex(
    "83af70d10d884a3f00000000000000004000000000000000"
    "91bac23c9287e1a90000000000000000e19f13c0e9b1c372"
    "73000000000000000000000000000000"
)


def _patterns(value: Any) -> list[str]:
    """grain's file patterns: one string, several separated by ';' (a mixture, with optional
    ',weight' each), or a list."""
    items = value.split(";") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return []
    return [str(item).split(",")[0].strip() for item in items if str(item).strip()]


def _check_array_record(module: ModuleConfig, key: str, path: Path) -> None:
    with path.open("rb") as stream:
        head = stream.read(len(ARRAY_RECORD_SIGNATURE))
    if head != ARRAY_RECORD_SIGNATURE:
        raise module.error(
            key,
            f"{key}: the grain data file {path} is not an ArrayRecord file (it does not start "
            "with the Riegeli signature every ArrayRecord file starts with)",
            hint="name ArrayRecord files, or set grain_file_type to the files' type "
            "(parquet, tfrecord, mmap)",
        )


def check_data_inputs(module: ModuleConfig) -> None:
    """Grain's files exist and are not empty, and ArrayRecord files (grain_file_type's default,
    MaxText's) start as one does; a tokenizer path that looks local exists."""
    params = module.params
    if params.get("dataset_type") == INDEXED:
        check_indexed(module)
        return
    if params.get("dataset_type") == "grain":
        for key in GRAIN_KEYS:
            for pattern in _patterns(params.get(key)):
                if is_remote(pattern):  # gs://... : grain reads it
                    continue
                files = glob.glob(pattern)
                if not files:
                    input_path(module, key, pattern, "the grain data")  # says what is missing
                for name in files:
                    path = input_path(module, key, name, "the grain data file")
                    if params.get("grain_file_type", "arrayrecord") == "arrayrecord":
                        _check_array_record(module, key, path)
    tokenizer = params.get("tokenizer_path")
    synthetic = params.get("dataset_type") == "synthetic"
    if (
        not synthetic
        and isinstance(tokenizer, str)
        and tokenizer.startswith(("/", "./", "../", "~"))
    ):
        input_path(module, "tokenizer_path", tokenizer, "the tokenizer", kind="any")


def check_indexed(module: ModuleConfig) -> None:
    """`dataset_path` (or each corpus of `dataset_blend`) names a prepared corpus whose
    vocabulary (its manifest's) fits the model's `vocab_size`; it is read for training only
    (no eval)."""
    key, params = "dataset_path", module.params
    prefixes = [params.get(key)]
    if params.get("dataset_blend"):
        key, prefixes = "dataset_blend", [item.get("path") for item in params["dataset_blend"]]
    for prefix in prefixes:
        if not prefix:
            raise module.error(key, f"{key}: name the prepared corpus (PREFIX of PREFIX.bin)")
        check_corpus(module, key, str(prefix))
        problem = vocabulary_problem(str(prefix), params.get("vocab_size"))
        if problem:
            raise module.error(key, f"{key}: {problem}", VOCABULARY_HINT)
    interval = params.get("eval_interval")
    if isinstance(interval, int) and interval > 0:
        raise module.error(
            "eval_interval",
            f"eval_interval: {interval} evaluates, and a prepared corpus (dataset_type: "
            "indexed) is read for training only",
            hint="set eval_interval: -1",
        )


def corpus_params(data: DataConfig) -> dict[str, tuple[Any, str]]:
    """`data:` as MaxText's keys: the prepared corpus (`dataset_path`) or the blend
    (`dataset_blend`) read through core's samples (`dataset_type: indexed`), its seed
    (`data_shuffle_seed`) and `max_target_length`. The corpus is read for training only: an
    eval_interval the experiment asks for is refused (`check_indexed`), not dropped."""
    params: dict[str, tuple[Any, str]] = {
        "dataset_type": (INDEXED, ""),
        "data_shuffle_seed": (data.seed, "seed"),
    }
    params |= data.corpus_keys("dataset_path", "dataset_blend")
    if data.seq_length is not None:
        params["max_target_length"] = (data.seq_length, "seq_length")
    return params
