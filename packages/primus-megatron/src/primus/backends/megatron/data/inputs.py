"""The indexed data and the tokenizer a Megatron module names, checked without importing
Megatron: each data prefix's .idx (the layout of megatron.core.datasets.indexed_dataset) and
.bin, so that a missing, empty or corrupt corpus is a config error in seconds instead of an
assertion after Megatron's start-up."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

from primus.core.config.experiment import ModuleConfig
from primus.core.config.inputs import input_path, is_remote

INDEX_HEADER = b"MMIDIDX\x00\x00"
HEADER_BYTES = 34  # header 9, version 8, dtype code 1, sequence count 8, document count 8
DTYPE_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}  # Megatron's DType codes
DATA_KEYS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
PREPARE = "primus data prepare makes a corpus: PREFIX.bin and PREFIX.idx"


def prefixes(value: Any) -> list[str]:
    """The data prefixes of a Megatron data key: `[prefix]`, `[weight, prefix, ...]` or the
    same as one space-separated string; the weights left out."""
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, list | tuple):
        return []
    return [str(item) for item in items if not _is_number(item)]


def _is_number(item: Any) -> bool:
    try:
        float(item)
    except (TypeError, ValueError):
        return False
    return True


def index_problem(idx: Path, data: Path) -> str | None:
    """Why Megatron could not read the corpus `idx` indexes in `data`, or None."""
    with idx.open("rb") as stream:
        head = stream.read(HEADER_BYTES)
        if len(head) < HEADER_BYTES or head[:9] != INDEX_HEADER:
            return f"{idx} is not a Megatron index file (bad header)"
        (version,) = struct.unpack("<Q", head[9:17])
        code = head[17]
        sequences, documents = struct.unpack("<QQ", head[18:34])
        if version != 1 or code not in DTYPE_BYTES:
            return f"{idx}: index version {version}, token type code {code}: not one Megatron reads"
        if sequences == 0:
            return f"{idx} indexes no documents: the corpus is empty"
        needed = HEADER_BYTES + sequences * 12 + documents * 8
        if idx.stat().st_size < needed:
            return f"{idx} is truncated: {idx.stat().st_size} bytes, its header needs {needed}"
        stream.seek(HEADER_BYTES + (sequences - 1) * 4)
        (length,) = struct.unpack("<i", stream.read(4))
        stream.seek(HEADER_BYTES + sequences * 4 + (sequences - 1) * 8)
        (pointer,) = struct.unpack("<q", stream.read(8))
    tokens_end = pointer + length * DTYPE_BYTES[code]
    if data.stat().st_size < tokens_end:
        return (
            f"{data} is truncated: {data.stat().st_size} bytes, its index {idx.name} "
            f"needs {tokens_end}"
        )
    return None


def check_data_inputs(module: ModuleConfig) -> None:
    """Every prefix of the data keys has a readable .idx and .bin that agree; a run on real
    data names a tokenizer, and a tokenizer path that looks local exists."""
    params = module.params
    if params.get("mock_data") is True:
        return
    named = False
    for key in DATA_KEYS:
        for prefix in prefixes(params.get(key)):
            named = True
            if is_remote(prefix):  # object storage: Megatron reads it
                continue
            idx = input_path(module, key, f"{prefix}.idx", "the index file", hint=PREPARE)
            data = Path(f"{prefix}.bin").expanduser()
            if not data.is_file():  # an empty one is judged against its index
                input_path(module, key, data, "the token file", hint=PREPARE)
            problem = index_problem(idx, data)
            if problem:
                raise module.error(key, f"{key}: {problem}", f"make it again: {PREPARE}")
    if named and params.get("tokenizer_type") is None:
        raise module.error(
            "data_path",
            "data_path: training on data needs a tokenizer, and tokenizer_type is not set",
            "set tokenizer_type (HuggingFaceTokenizer with tokenizer_model, or NullTokenizer "
            "with vocab_size for data tokenized elsewhere)",
        )
    model = params.get("tokenizer_model")
    if isinstance(model, str) and model.startswith(("/", "./", "../", "~")):
        input_path(module, "tokenizer_model", model, "the tokenizer", kind="any")
