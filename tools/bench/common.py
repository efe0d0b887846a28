"""What the benchmark scripts share: the resolved experiment, running a command, the report."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any


def resolved_params(config: Path) -> dict[str, Any]:
    """The single module's params of a Primus experiment, as `primus config show` resolves them."""
    out = subprocess.run(
        [sys.executable, "-m", "primus.cli", "config", "show", str(config), "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    modules = json.loads(out.stdout)["modules"]
    return next(iter(modules.values()))["overrides"]


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> str:
    """Run `command`, keep its output in `log`, stop the benchmark if it fails."""
    print("$", " ".join(command), flush=True)
    result = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(env or {})})
    log.write_text(result.stdout + result.stderr)
    if result.returncode:
        raise SystemExit(f"failed ({result.returncode}); see {log}:\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def environment(distributions: tuple[str, ...]) -> dict[str, Any]:
    """Date, device and versions for the JSON report."""
    import torch

    return {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "versions": {
            "python": platform.python_version(),
            **{d: metadata.version(d) for d in distributions},
        },
    }
