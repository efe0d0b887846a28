"""The indexed data and the tokenizer a Megatron module names, checked without importing
Megatron: each data prefix's .idx and .bin (the indexed format, read by core's
`primus.core.data.indexed`), so that a missing, empty or corrupt corpus is a config error in
seconds instead of an assertion after Megatron's start-up."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from primus.core.config.data_section import DataConfig
from primus.core.config.experiment import ModuleConfig
from primus.core.config.inputs import check_corpus, input_path, is_remote
from primus.core.data.manifest import read_manifest, tokenizer_problem, vocabulary_problem

DATA_KEYS = ("data_path", "train_data_path", "valid_data_path", "test_data_path")
SET_TOKENIZER = (
    "set tokenizer_type (HuggingFaceTokenizer with tokenizer_model, or NullTokenizer "
    "with vocab_size for data tokenized elsewhere)"
)


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


def check_data_inputs(module: ModuleConfig) -> None:
    """Every prefix of the data keys has a readable .idx and .bin that agree; a run on real
    data names a tokenizer, and a tokenizer path that looks local exists."""
    params = module.params
    if params.get("mock_data") is True:
        return
    named, local = False, []
    for key in DATA_KEYS:
        for prefix in prefixes(params.get(key)):
            named = True
            if is_remote(prefix):  # object storage: Megatron reads it
                continue
            local.append(prefix)
            check_corpus(module, key, prefix)
    implied = corpus_tokenizer(params)  # reads each manifest once
    if named and params.get("tokenizer_type") is None and implied is None:
        raise module.error(
            "data_path",
            "data_path: training on data needs a tokenizer, and tokenizer_type is not set",
            tokenizer_hint(local),
        )
    model = params.get("tokenizer_model")
    if isinstance(model, str) and model.startswith(("/", "./", "../", "~")):
        input_path(module, "tokenizer_model", model, "the tokenizer", kind="any")
    null = params.get("tokenizer_type") == "NullTokenizer" or implied is not None
    for prefix in local:
        _check_tokenized_alike(module, prefix, null)


def _check_tokenized_alike(module: ModuleConfig, prefix: str, null: bool) -> None:
    """The corpus's manifest agrees with the tokenizer the run names: a NullTokenizer's (`null`)
    vocab_size holds its token ids, a local HF tokenizer is the one that made it."""
    params = module.params
    if null:
        problem = vocabulary_problem(prefix, params.get("vocab_size"))
        if problem:
            raise module.error("vocab_size", f"vocab_size: {problem}", tokenizer_hint([prefix]))
    model = params.get("tokenizer_model")
    if params.get("tokenizer_type") == "HuggingFaceTokenizer" and isinstance(model, str):
        problem = tokenizer_problem(prefix, model)
        if problem:
            raise module.error(
                "tokenizer_model",
                f"tokenizer_model: {problem}",
                hint="name the tokenizer the corpus was prepared with, or prepare it again "
                "with this one",
            )


def corpus_tokenizer(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The tokenizer params a run on prepared corpora needs when it sets no tokenizer_type:
    NullTokenizer (the corpus holds token ids; the model's vocab_size bounds them) with the
    manifests' end-of-document id. None when the run names a tokenizer, or names a data prefix
    that is remote or has no manifest, or manifests whose end-of-document ids differ."""
    named = [prefix for key in DATA_KEYS for prefix in prefixes(params.get(key))]
    if params.get("tokenizer_type") is not None or not named or any(map(is_remote, named)):
        return None
    records = [read_manifest(Path(prefix).expanduser()) for prefix in named]
    eods = {(record.get("eod") or {}).get("id") for record in records if record is not None}
    if None in records or len(eods) != 1:
        return None
    eod = eods.pop()
    return {"tokenizer_type": "NullTokenizer"} | (
        {"null_tokenizer_eod_id": eod} if eod is not None else {}
    )


def tokenizer_hint(local: list[str]) -> str:
    """How to set the tokenizer: for a corpus whose manifest (primus data prepare's PREFIX.json)
    gives its vocabulary size and end-of-document id, the params that read it as it is."""
    for prefix in local:
        record = read_manifest(Path(prefix).expanduser())
        if record is not None:
            params = f"tokenizer_type=NullTokenizer vocab_size={record['vocab_size']}"
            if record.get("eod"):
                params += f" null_tokenizer_eod_id={record['eod']['id']}"
            return f"{prefix} is tokenized already (its manifest {prefix}.json): set {params}"
    return SET_TOKENIZER


def corpus_params(data: DataConfig) -> dict[str, tuple[Any, str]]:
    """`data:` as Megatron's own keys: `data_path` (a blend as [weight, prefix, ...]), the
    whole corpus for training (`split` 100,0,0, as every backend reads it), `seed` (Megatron's
    one seed: the sample order's, and the initial weights' without init_from) and
    `seq_length`."""
    corpora = data.corpora
    blend = (
        [str(corpora[0].prefix)]
        if len(corpora) == 1
        else [item for c in corpora for item in (str(c.weight), str(c.prefix))]
    )
    params: dict[str, tuple[Any, str]] = {
        "data_path": (blend, "path"),
        "split": ("100,0,0", ""),
        "mock_data": (False, ""),
        "seed": (data.seed, "seed"),
    }
    if data.seq_length is not None:
        params["seq_length"] = (data.seq_length, "seq_length")
    return params
