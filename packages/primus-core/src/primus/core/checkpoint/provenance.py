"""Where a checkpoint came from: the record Primus writes beside every checkpoint it makes.

`primus_provenance.json` holds the resolved experiment, the Primus, backend and upstream
versions, the git commit and uv.lock hash of the checkout it ran from (if any), and the
initial weights (the HF model's directory, its config.json and the dtype of its tensors: what
an export gives back). Runs write it into their run directory; imports and exports into the
folder they write. `primus checkpoint inspect` shows it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.core import __version__
from primus.core.checkpoint.hf import read_config, weights_dtype
from primus.core.errors import ConfigError, json_type
from primus.core.reliability.atomic import write_json

if TYPE_CHECKING:
    from primus.core.config.experiment import Experiment, ModuleConfig

PROVENANCE_FILE = "primus_provenance.json"
DAMAGED = (
    f"Primus writes {PROVENANCE_FILE} beside the checkpoints it makes: restore it or remove it"
)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkout() -> dict[str, Any] | None:
    """The git commit (and whether the tree has changes) and the uv.lock hash of the checkout
    the current directory is in; None outside a git checkout."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD")
    if not top or not commit:
        return None
    lock = Path(top) / "uv.lock"
    return {
        "root": top,
        "commit": commit,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "uv_lock_sha256": _sha256(lock) if lock.is_file() else None,
    }


def initial_weights(hf_dir: Path | None) -> dict[str, Any] | None:
    """The HF directory a run started from: the hash of its config.json, the dtype of most of
    its tensors, and the config itself (an export writes it back when the folder is gone)."""
    if hf_dir is None:
        return None
    return {
        "hf": str(hf_dir),
        "config_sha256": config_sha256(hf_dir),
        "dtype": weights_dtype(hf_dir),
        "config": read_config(hf_dir),
    }


def config_sha256(hf_dir: Path) -> str:
    return _sha256(hf_dir / "config.json")


def record(
    experiment: Experiment, module: ModuleConfig, init_from: Path | None,
    weights: dict[str, Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The provenance of a checkpoint written by `module` of `experiment`; `weights`: the
    `initial_weights` record (default: that of `init_from`)."""
    from primus.core.backend.backend_registry import BackendRegistry
    from primus.core.config.experiment import resolved_tree
    from primus.core.config.render import to_yaml

    info = BackendRegistry.info(module.framework)
    adapter = BackendRegistry.get_adapter(module.framework)
    return {
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "primus": __version__,
        "backend": {
            "name": module.framework,
            "distribution": info.distribution,
            "version": info.version,
            "upstream": info.upstream_requirement,
            "upstream_version": adapter.detect_backend_version(),
        },
        "checkout": checkout(),
        "initial_weights": weights or initial_weights(init_from),
        "experiment": to_yaml(resolved_tree(experiment)),
    }


def write_provenance(
    path: Path, experiment: Experiment, module: ModuleConfig, init_from: Path | None,
    weights: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    write_json(path, record(experiment, module, init_from, weights))


def read_provenance(path: Path) -> dict[str, Any] | None:
    """The provenance of the checkpoint at `path`: its own record, or that of the run
    directory it lies in (up to three folders up). A ConfigError names a damaged record."""
    for folder in [path.resolve(), *path.resolve().parents][:4]:
        file = folder / PROVENANCE_FILE
        if file.is_file():
            try:
                found = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:  # a UnicodeDecodeError is a ValueError
                raise ConfigError(f"{file}: not a provenance record ({exc})",
                                  hint=DAMAGED) from None  # fmt: skip
            weights = found.get("initial_weights") if isinstance(found, dict) else None
            if not isinstance(found, dict):
                why = f"{json_type(found)}, not an object"
            elif weights is not None and not (
                isinstance(weights, dict) and isinstance(weights.get("hf"), str)
            ):
                why = "its initial_weights name no HF folder"
            else:
                return {"file": str(file), **found}
            raise ConfigError(f"{file}: not a provenance record ({why})", hint=DAMAGED)
    return None
