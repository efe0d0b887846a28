"""Helpers for backend tests: a `primus train` subprocess and its metrics, or the backend args
a run would build, in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml


def primus(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`primus ARGS` in a subprocess (the installed CLI of this interpreter), output captured.

    The environment is this process's, less PRIMUS_PATCHES (a test names its own), plus `env`.
    """
    inherited = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"}
    return subprocess.run(
        [sys.executable, "-m", "primus.cli", *args],
        env=inherited | env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


FRAMEWORKS = ("torch", "jax", "megatron", "torchtitan", "maxtext", "transformers")
_IMPORTS_TOLD = """
import sys
from primus.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
told = ",".join(name for name in {frameworks!r} if sys.modules.get(name) is not None)
print("imported: " + told, file=sys.stderr)
sys.exit(code)
"""


def primus_imports(
    *args: str, cwd: Path | None = None, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """`primus ARGS` as `primus` runs it, and the frameworks (of FRAMEWORKS) the process had
    imported when the command ended (not one it hid); the line that tells them is taken out of
    stderr."""
    inherited = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"}
    code = _IMPORTS_TOLD.format(frameworks=FRAMEWORKS)
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=inherited | env, cwd=cwd,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    head, _, told = done.stderr.rstrip("\n").rpartition("\n")
    assert told.startswith("imported: "), done.stderr[-3000:]
    done.stderr = head + "\n"
    return done, [name for name in told.removeprefix("imported: ").split(",") if name]


# The three ways to check an experiment: each must refuse bad input alike, before any import.
FAST_FORMS = {
    "run": ("train", "pretrain", "--config"),
    "dry-run": ("train", "pretrain", "--dry-run", "--config"),
    "validate": ("config", "validate"),
}


def refused(tmp_path: Path, form: str, config: Path, *args: str) -> str:
    """Run `form` (of FAST_FORMS) of `config` with `args`; assert it failed as bad config
    (exit 2, no traceback) without importing a framework or making the workspace; its
    stderr."""
    workspace = tmp_path / "ws"
    done, imported = primus_imports(
        *FAST_FORMS[form], str(config), *args, PRIMUS_WORKSPACE=str(workspace)
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert imported == []
    assert not workspace.exists()
    return done.stderr


def preset_args(
    workspace: Path,
    framework: str,
    module: str,
    model: str,
    patches: str = "none",
    **overrides: Any,
) -> Any:
    """The backend args that `primus train` builds for module preset `module` with model preset
    `model` (and `overrides`), through the setup and build_args patches that `patches` selects
    (PRIMUS_PATCHES syntax), in this process: no trainer. The environment is put back as it
    was (a backend's prepare_backend exports RANK, WORLD_SIZE and MASTER_PORT, which would
    make a later `primus train --nproc-per-node 2` believe it already runs under torchrun);
    the test restores the names the patches replaced."""
    from primus.core.runtime.primus_runtime import PrimusRuntime

    exp = workspace / "exp.yaml"
    pre_trainer = {"framework": framework, "config": module, "model": model, "overrides": overrides}
    exp.write_text(
        yaml.safe_dump({"workspace": str(workspace), "modules": {"pre_trainer": pre_trainer}})
    )
    saved = dict(os.environ)
    os.environ["PRIMUS_PATCHES"] = patches
    try:
        return PrimusRuntime(exp).backend_args()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def train_run(config: Path, workspace: Path, *overrides: str, nproc: int = 1) -> Path:
    """Run `primus train pretrain --config config` (exp_name=... among the overrides) in
    `workspace`; assert it succeeded and return its run directory."""
    launch = ["--nproc-per-node", str(nproc)] if nproc > 1 else []
    result = primus(
        "train", "pretrain", "--config", str(config), *launch, *overrides,
        PRIMUS_WORKSPACE=str(workspace),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    name = next(o.split("=", 1)[1] for o in overrides if o.startswith("exp_name="))
    return next(workspace.rglob(name))


def rejected(recipe: Path, tmp_path: Path, *lines: str, train: bool = False) -> str:
    """Extend `recipe` with override `lines` (YAML, indented under the module's overrides) and
    run `config validate`, or `train --dry-run --full` with `train` (the upstream's own
    validation); assert it fails as bad config (exit 2, no traceback) and return its stderr."""
    exp = tmp_path / "exp.yaml"
    body = "".join(f"      {line}\n" for line in lines)
    exp.write_text(f"extends: {recipe}\nmodules:\n  pre_trainer:\n    overrides:\n{body}")
    args = ("train", "pretrain", "--config", str(exp), "--dry-run", "--full") if train else (
        "config", "validate", str(exp))  # fmt: skip
    result = primus(*args, cwd=tmp_path, PRIMUS_WORKSPACE=str(tmp_path / "ws"))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    return result.stderr


def patch_status(run_dir: Path) -> dict[str, tuple[str, str]]:
    """Patch id -> (status, reason) from the run's patch_report.json; none failed or not run."""
    report = json.loads((run_dir / "patch_report.json").read_text())
    assert report["summary"]["failed"] == 0 and report["summary"]["not run"] == 0
    return {p["id"]: (p["status"], p["reason"]) for p in report["patches"]}


def step_metrics(run_dir: Path) -> list[dict]:
    """Every record of the run's metrics.jsonl (a torn last line left out)."""
    from primus.core.metrics import read_metrics

    return read_metrics(run_dir / "metrics.jsonl")


def losses(run_dir: Path) -> dict[int, float]:
    """Step -> loss from the run's metrics.jsonl."""
    return {m["step"]: m["loss"] for m in step_metrics(run_dir)}


def assert_loss_falls(curve: dict[int, float], by: float = 0.5) -> None:
    steps = sorted(curve)
    first, last = curve[steps[0]], curve[steps[-1]]
    assert last < first - by, f"loss did not fall by {by}: {first:.3f} -> {last:.3f}"
