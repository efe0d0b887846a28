"""A module's `init_from:` section: `{hf: DIR}`, the Hugging Face model the run starts from,
and with LoRA `{hf: DIR, adapter: DIR}`, a PEFT LoRA adapter its adapters start from. Both
checked when the experiment loads, without importing torch: the folders' files, and the
adapter's config against the module's `peft:` section.

Paths are relative to the current directory, like every path in an experiment.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from primus.core.config.posttrain import PeftConfig
from primus.core.config.tree import ConfigTree
from primus.core.config.yaml_io import KeyPath
from primus.core.errors import ConfigError, Origin

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
SHAPE = "{hf: <Hugging Face model directory>, adapter: <PEFT LoRA adapter directory>}"


def _folder(section: dict[str, Any], key: str, origin: Origin | None) -> Path:
    if not isinstance(section[key], str) or not section[key]:
        raise ConfigError(f"'init_from.{key}' must be a directory path", origin)
    return Path(os.path.expanduser(section[key]))  # Path's raises for an unknown ~user


def init_from(exp: ConfigTree, module: KeyPath) -> tuple[Path | None, Origin | None, Path | None]:
    """The module's `init_from`: the HF model folder, where it was set, and the PEFT adapter
    folder (or None), each checked to hold its files."""
    path: KeyPath = (*module, "init_from")
    section = exp.get(path)
    if section is None:
        return None, None, None
    if not isinstance(section, dict) or "hf" not in section or set(section) - {"hf", "adapter"}:
        raise ConfigError(f"'init_from' must be {SHAPE} (adapter optional)", exp.origin(path))
    origin = exp.origin((*path, "hf"))
    folder = _folder(section, "hf", origin)
    if not os.path.isfile(folder / "config.json") or not any(folder.glob("*.safetensors")):
        raise ConfigError(
            f"init_from.hf: {folder} is not a Hugging Face model directory",
            origin,
            hint="it needs config.json and *.safetensors",
        )
    if "adapter" not in section:
        return folder.resolve(), origin, None
    where = exp.origin((*path, "adapter"))
    adapter = _folder(section, "adapter", where)
    if not all(os.path.isfile(adapter / name) for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)):
        raise ConfigError(
            f"init_from.adapter: {adapter} is not a PEFT adapter directory",
            where,
            hint=f"it needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} (primus checkpoint export "
            "--adapter writes them)",
        )
    return folder.resolve(), origin, adapter.resolve()


def _adapter_peft(folder: Path, where: Origin | None) -> dict[str, Any]:
    """The LoRA settings of the adapter in `folder` (PEFT's names mapped to `peft:`'s)."""
    try:
        config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise ConfigError(f"init_from.adapter: {folder / ADAPTER_CONFIG}: {exc}", where) from None
    kind = config.get("peft_type") if isinstance(config, dict) else None
    if kind != "LORA" or config.get("use_dora") or config.get("use_rslora"):
        raise ConfigError(
            f"init_from.adapter: {folder} is a {kind} adapter"
            + (" with DoRA or rsLoRA" if kind == "LORA" else ""),
            where,
            hint="Primus's LoRA continues plain LoRA adapters",
        )
    targets = config.get("target_modules")
    if not isinstance(targets, list):
        raise ConfigError(f"init_from.adapter: {folder} names its target modules by a pattern "
                          f"({targets!r}), not a list", where)  # fmt: skip
    return {"rank": config.get("r"), "alpha": float(config.get("lora_alpha") or 0),
            "target_modules": sorted(targets)}  # fmt: skip


def with_adapter(peft: PeftConfig | None, adapter: Path, where: Origin | None) -> PeftConfig:
    """`peft` starting from the adapter in `adapter`, whose rank, alpha and targets it must
    have."""
    theirs = _adapter_peft(adapter, where)
    if peft is None:
        raise ConfigError(
            "init_from.adapter: continuing an adapter needs the module's peft: section",
            where,
            hint=f"add peft: {{type: lora, rank: {theirs['rank']}, alpha: {theirs['alpha']:g}, "
            f"target_modules: {theirs['target_modules']}}} (the adapter's)",
        )
    ours = {"rank": peft.rank, "alpha": peft.alpha, "target_modules": sorted(peft.target_modules)}
    for key, value in ours.items():
        if theirs[key] != value:
            raise peft.error(
                key,
                f"peft.{key} is {value}, and the adapter init_from.adapter names has {theirs[key]}",
                hint=f"set peft.{key}: {theirs[key]}",
            )
    origins = {**peft.origins, "adapter": where} if where else peft.origins
    return dataclasses.replace(peft, adapter=adapter, origins=origins)
