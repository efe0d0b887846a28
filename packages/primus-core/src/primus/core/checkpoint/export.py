"""What an HF export gives back besides the tensors the backend converts: the HF model the
checkpoint came from (its source) is found, the dtype is chosen, and what the backend's args
cannot say is carried over from the source: its config.json, tokenizer and
generation_config.json.

The source is the module's `init_from`, else the HF model named by the provenance of the run's
import folder (`primus checkpoint import`). Its config.json is written back whenever the
backend reads the same model from it as from the config it derived from the checkpoint (so
fields the backend keeps no number for, such as max_position_embeddings, come back as they went
in); the export's dtype defaults to the source's.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.core.checkpoint.hf import read_config, weights_dtype
from primus.core.checkpoint.preset import flatten, same_value
from primus.core.checkpoint.provenance import config_sha256, initial_weights, read_provenance
from primus.core.errors import ConfigError
from primus.core.logging import get_logger
from primus.core.reliability.atomic import write_json

if TYPE_CHECKING:
    from primus.core.backend.backend_adapter import BackendAdapter
    from primus.core.config.experiment import ModuleConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "chat_template.jinja")  # fmt: skip
GENERATION_CONFIG = "generation_config.json"
EXPORT_DTYPES = ("float32", "bfloat16", "float16")  # what every backend's export writes


@dataclass(frozen=True)
class HFSource:
    """The HF model a checkpoint was imported from: its provenance record (`initial_weights`:
    hf, config_sha256, dtype, config), and its folder while that is there unchanged."""

    record: dict[str, Any]
    folder: Path | None

    @property
    def name(self) -> str:
        return str(self.record["hf"])


def find_source(
    adapter: BackendAdapter, module: ModuleConfig, backend_args: Any
) -> HFSource | None:
    """The module's `init_from`, else the HF model the provenance of the run's import folder
    (or of the run directory holding it) names; None when neither is known."""
    if module.init_from is not None:
        return HFSource(initial_weights(module.init_from) or {}, module.init_from)
    try:
        folder = adapter.hf_import_dir(backend_args)
    except ConfigError:
        folder = None
    found = read_provenance(Path(folder)) if folder is not None else None
    weights = (found or {}).get("initial_weights")
    if not weights:
        return None
    hf = Path(weights["hf"])
    if (hf / "config.json").is_file() and config_sha256(hf) == weights.get("config_sha256"):
        return HFSource(initial_weights(hf) or {}, hf)
    return HFSource(weights, None)  # moved or changed since: the record's config and dtype


def choose_dtype(
    adapter: BackendAdapter, module: ModuleConfig, source: HFSource | None
) -> tuple[str | None, str]:
    """(the dtype to write, None for the checkpoint's own; why): the backend's export dtype
    option where the experiment sets it, else the source's dtype."""
    key = adapter.hf_export_dtype_key
    value = module.tree.get(tuple(key.split("."))) if key else None
    if key and value is not None:
        return str(value), f"{key} set by {module.origin(key) or 'a patch'}"
    if source is None:
        return None, "the checkpoint's own dtype: no HF model it came from is known"
    dtype = source.record.get("dtype")
    if dtype in EXPORT_DTYPES:
        return dtype, f"the dtype of {source.name}, the HF model it was imported from"
    return None, f"the checkpoint's own dtype: {source.name}'s ({dtype}) is not one to write"


def preset_differences(adapter: BackendAdapter, source: dict[str, Any],
                       derived: dict[str, Any]) -> list[str]:  # fmt: skip
    """`key: source's, derived's` for each architecture key where the backend's model presets
    for two HF configs differ (its training keys left out)."""
    try:
        theirs, ours = (dict(flatten(adapter.model_preset_from_hf(c))) for c in (source, derived))
    except ConfigError as exc:
        return [f"no preset: {exc}"]
    keys = sorted((theirs.keys() | ours.keys()) - adapter.hf_preset_training_keys)
    return [f"{k}: {theirs.get(k)!r}, {ours.get(k)!r}" for k in keys
            if not same_value(theirs.get(k), ours.get(k))]  # fmt: skip


def copy_tokenizer(source: Path, out: Path, names: tuple[str, ...] | None = None) -> list[str]:
    """Copy an HF tokenizer's files (`names`, default: TOKENIZER_FILES and
    GENERATION_CONFIG) that the folder `source` has into `out`; the names copied."""
    names = (*TOKENIZER_FILES, GENERATION_CONFIG) if names is None else names
    copied = [n for n in names if (source / n).is_file()]
    for name in copied:
        shutil.copyfile(source / name, out / name)
    return copied


def carry_over(adapter: BackendAdapter, out: Path, source: HFSource) -> None:
    """Complete the backend's export in `out` from `source`: its config.json (with the
    tensors' dtype) where the backend reads the same model from both, its tokenizer where the
    experiment's gave none, its generation_config.json where none came."""
    log = get_logger()
    derived, config = read_config(out), source.record.get("config")
    differ = preset_differences(adapter, config, derived) if config else []
    if config is None:
        log.warning(f"export: config.json derived from the checkpoint: {source.name} has moved "
                    "or changed, and its provenance record keeps no config")  # fmt: skip
    elif differ:
        log.warning(f"export: config.json derived from the checkpoint, not {source.name}'s: "
                    f"the models differ (source, checkpoint: {'; '.join(differ)})")  # fmt: skip
    else:
        config = dict(config)
        config.setdefault("architectures", derived.get("architectures"))
        dtype = weights_dtype(out)
        for key in [k for k in ("dtype", "torch_dtype") if k in config] or ["dtype"]:
            config[key] = dtype
        write_json(out / "config.json", config)
        log.info(f"export: config.json is {source.name}'s")
    if source.folder is not None:
        has_tokenizer = any((out / n).is_file() for n in TOKENIZER_FILES)
        wanted = (() if has_tokenizer else TOKENIZER_FILES) + (
            () if (out / GENERATION_CONFIG).is_file() else (GENERATION_CONFIG,)
        )
        copied = copy_tokenizer(source.folder, out, wanted)
        if copied:
            log.info(f"export: {', '.join(copied)} from {source.folder}")
