"""`primus checkpoint preset`: a backend's model preset derived from an HF config.json."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from primus.core.checkpoint.hf import read_config
from primus.core.errors import ConfigError

if TYPE_CHECKING:
    from primus.core.backend.backend_adapter import BackendAdapter


def flatten(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of each leaf of a nested preset (an empty dict is a leaf)."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def same_value(hf_value: Any, value: Any) -> bool:
    """Equal preset values: numbers by value (1 == 1.0), but a bool is never a number."""
    numbers = (int, float)
    if isinstance(hf_value, numbers) and isinstance(value, numbers):
        return bool(isinstance(hf_value, bool) == isinstance(value, bool) and hf_value == value)
    return bool(hf_value == value)


def pick_framework(framework: str | None) -> str:
    """`framework`, or the only ready backend when none is named."""
    from primus.core.backend.backend_registry import BackendRegistry
    from primus.core.backend.discovery import READY

    if framework:
        return framework
    ready = sorted(n for n, i in BackendRegistry.backends().items() if i.status == READY)
    if len(ready) != 1:
        raise ConfigError(
            "name the backend with --framework",
            hint=f"ready backends: {', '.join(ready) or 'none'}",
        )
    return ready[0]


def preset_from_hf(adapter: BackendAdapter, hf_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """`adapter`'s model preset for `config`, the config.json of `hf_dir`; the adapter's
    complaints about a field ("config.json: ...") name the file's path."""
    try:
        return adapter.model_preset_from_hf(config)
    except ConfigError as exc:
        if exc.message.startswith("config.json:"):
            exc.message = f"{hf_dir / 'config.json'}{exc.message.removeprefix('config.json')}"
        raise


def _one_line(value: object) -> str:
    """`value` for a YAML comment: a newline in it would start a line of YAML."""
    return " ".join(str(value).split())


def derive_preset(hf_dir: Path, framework: str) -> str:
    """The YAML text of `framework`'s model preset for the HF model in `hf_dir`."""
    from primus.core.backend.backend_registry import BackendRegistry, require

    config = read_config(hf_dir)
    adapter = BackendRegistry.get_adapter(framework)
    require(adapter, "hf-import")
    preset = preset_from_hf(adapter, hf_dir, config)
    source = _one_line(config.get("_name_or_path") or hf_dir.resolve())
    names = config.get("architectures") or []
    names = ", ".join(map(_one_line, names if isinstance(names, list) else [names])) or "-"
    header = (
        f"# {framework} model preset derived from the Hugging Face config.json of {source}\n"
        f"# (primus checkpoint preset; model_type {config.get('model_type')}, "
        f"architectures {names}).\n"
        "# Use it as a module's `model:` (a path relative to the experiment, or a name found in\n"
        f"# PRIMUS_CONFIG_PATH/models/{framework}/).\n"
    )
    return header + yaml.safe_dump(preset, sort_keys=False)
