"""The data files and tokenizer a MaxText module names, checked without importing MaxText or
JAX: every file `grain_train_files` (and `grain_eval_files`) matches, and a local
`tokenizer_path`."""

from __future__ import annotations

import glob
from typing import Any

from primus.core.config.experiment import ModuleConfig
from primus.core.config.inputs import input_path, is_remote

GRAIN_KEYS = ("grain_train_files", "grain_eval_files")


def _patterns(value: Any) -> list[str]:
    """grain's file patterns: one string, several separated by ';' (a mixture, with optional
    ',weight' each), or a list."""
    items = value.split(";") if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return []
    return [str(item).split(",")[0].strip() for item in items if str(item).strip()]


def check_data_inputs(module: ModuleConfig) -> None:
    """Grain's files exist and are not empty; a tokenizer path that looks local exists."""
    params = module.params
    if params.get("dataset_type") == "grain":
        for key in GRAIN_KEYS:
            for pattern in _patterns(params.get(key)):
                if is_remote(pattern):  # gs://... : grain reads it
                    continue
                files = glob.glob(pattern)
                if not files:
                    input_path(module, key, pattern, "the grain data")  # says what is missing
                for name in files:
                    input_path(module, key, name, "the grain data file")
    tokenizer = params.get("tokenizer_path")
    synthetic = params.get("dataset_type") == "synthetic"
    if (
        not synthetic
        and isinstance(tokenizer, str)
        and tokenizer.startswith(("/", "./", "../", "~"))
    ):
        input_path(module, "tokenizer_path", tokenizer, "the tokenizer", kind="any")
