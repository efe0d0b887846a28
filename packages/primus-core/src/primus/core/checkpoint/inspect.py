"""`primus checkpoint inspect`: what a checkpoint is. Core reads HF directories itself and asks
every ready backend's `inspect_checkpoint` hook about anything else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from primus.core.checkpoint.hf import inspect_hf_directory, is_hf_directory
from primus.core.checkpoint.provenance import read_provenance
from primus.core.errors import ConfigError

RUN_CONFIG = "config.resolved.yaml"  # what every Primus run writes into its run directory


def inspect_checkpoint(path: Path) -> dict[str, Any]:
    """The description of the checkpoint at `path`; ConfigError if nothing recognises it."""
    from primus.core.backend.backend_registry import BackendRegistry
    from primus.core.backend.capabilities import provides
    from primus.core.backend.discovery import READY

    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    found: dict[str, Any] | None
    if is_hf_directory(path):
        found = inspect_hf_directory(path)
    else:
        ready = sorted(
            name
            for name, info in BackendRegistry.backends().items()
            if info.status == READY and provides(info.adapter_class, "checkpoint-inspect")
        )
        found = _native(ready, path)
        if found is None:
            raise ConfigError(
                f"{path}: not a checkpoint Primus recognises",
                hint="looked for a Hugging Face directory (config.json + *.safetensors) and the "
                f"native checkpoints of the ready backends ({', '.join(ready) or 'none'})",
            )
    return {"path": str(path), **found, "provenance": provenance(path)}


def _native(backends: list[str], path: Path) -> dict[str, Any] | None:
    """The first description of `path` one of `backends` gives; None when none recognises it.
    A backend whose reader fails on it (a damaged or cut-short file) is one ConfigError, unless
    another backend recognises the checkpoint."""
    from primus.core.backend.backend_registry import BackendRegistry

    failed: tuple[str, BaseException] | None = None
    for backend in backends:
        try:
            found = BackendRegistry.get_adapter(backend).inspect_checkpoint(path)
        except (ConfigError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # DCP's failures are BaseExceptions
            failed = failed or (backend, exc)
            continue
        if found is not None:
            return found
    if failed is None:
        return None
    backend, error = failed
    said = (str(error).strip().splitlines() or [""])[0][:200]
    raise ConfigError(
        f"{path}: a {backend} checkpoint whose files cannot be read "
        f"({type(error).__name__}: {said})",
        hint="it may be damaged or cut short; inspect another iteration's folder",
    ) from error


def provenance(path: Path) -> dict[str, Any] | None:
    """Where `path` came from: its provenance record (the resolved experiment and the initial
    weights' config.json shortened to the file holding them), and the Primus run directory it
    lies in, if any."""
    record = read_provenance(path)
    if record is not None:
        if isinstance(record.get("experiment"), str):
            record["experiment"] = f"{len(record['experiment'].splitlines())} lines (in the file)"
        weights = record.get("initial_weights") or {}
        if isinstance(weights.get("config"), dict):
            weights["config"] = f"{len(weights['config'])} fields (in the file)"
    for folder in [path.resolve(), *path.resolve().parents][:4]:
        if (folder / RUN_CONFIG).is_file():
            return {"run_dir": str(folder), "resolved_config": str(folder / RUN_CONFIG),
                    **(record or {})}  # fmt: skip
    return record


def render(info: dict[str, Any], indent: int = 0) -> list[str]:
    """`info` as indented `key: value` lines (nested dicts indented, empty values left out)."""
    lines = []
    for key, value in info.items():
        if value is None or value == {}:
            continue
        if isinstance(value, dict):
            lines += [f"{'  ' * indent}{key}:", *render(value, indent + 1)]
        else:
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            lines.append(f"{'  ' * indent}{key}: {shown}")
    return lines
