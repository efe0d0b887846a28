"""Shared by the cross-package tests: wheels built once per session, and fresh virtual
environments that install some of them (nothing of this checkout can stand in for them)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
PROJECTS = {
    "primus-core": REPO / "packages" / "primus-core",
    "primus-megatron": REPO / "packages" / "primus-megatron",  # built and inspected, not installed
    "primus-torchtitan": REPO / "packages" / "primus-torchtitan",  # built and inspected
    "primus-maxtext": REPO / "packages" / "primus-maxtext",  # installed alone, without torch
    "primus-turbo-kernels": REPO / "packages" / "primus-turbo-kernels",  # patches, no torch
    "primus-testing": REPO / "packages" / "primus-testing",  # the scaffold's conformance suite
    "dummytrain": FIXTURES / "dummytrain",
    "primus-backend-dummy": FIXTURES / "primus-backend-dummy",
    "primus-backend-broken": FIXTURES / "primus-backend-broken",
    "primus-backend-future": FIXTURES / "primus-backend-future",
}


def uv_path() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` exports UV, its own path
    assert uv, "the wheel test needs uv: run the suite with `uv run pytest`"
    return uv


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 120):
    return subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def check(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (
        f"{proc.args} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


@dataclass
class Venv:
    """A fresh virtual environment holding some of the wheels."""

    root: Path
    wheels: Path
    scratch: Path  # cwd of every command: outside the checkout

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def primus_exe(self) -> Path:
        return self.root / "bin" / "primus"

    def env(self, workspace: Path | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PRIMUS_", "UV_", "PYTHON"))
            and k not in ("VIRTUAL_ENV", "BACKEND_PATH", "CONDA_PREFIX")
        }
        env["PATH"] = f"{self.root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(self.root)
        env["NO_COLOR"] = "1"
        env["COLUMNS"] = "200"
        if workspace is not None:
            env["PRIMUS_WORKSPACE"] = str(workspace)
        return env

    def pip(self, *args: str) -> None:
        check(run([uv_path(), "pip", *args, "--python", str(self.python)], cwd=REPO))

    def install(self, *dists: str) -> None:
        self.pip("install", "--find-links", str(self.wheels), *dists)

    def uninstall(self, *dists: str) -> None:
        self.pip("uninstall", *dists)

    def primus(self, *args: str, workspace: Path | None = None):
        return run([str(self.primus_exe), *args], cwd=self.scratch, env=self.env(workspace))

    def installed(self) -> set[str]:
        proc = check(
            run(
                [uv_path(), "pip", "list", "--format", "json", "--python", str(self.python)],
                cwd=REPO,
            )
        )
        return {d["name"] for d in json.loads(proc.stdout)}


def make_venv(root: Path, wheels: Path, scratch: Path, dists: tuple[str, ...]) -> Venv:
    check(run([uv_path(), "venv", "--python", "3.12", "--quiet", str(root)], cwd=REPO))
    venv = Venv(root, wheels, scratch)
    venv.install(*dists)
    return venv


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every distribution built once per test run, as a wheel, the way a release would build
    it; under pytest-xdist the first worker to ask builds them for all."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.getbasetemp().parent / "wheels"  # the run's, not the worker's
    else:
        out = tmp_path_factory.getbasetemp() / "wheels"
    out.mkdir(exist_ok=True)
    with (out / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".built").exists():
            _build_wheels(out)
            (out / ".built").touch()
    return out


def _build_wheels(out: Path) -> None:
    uv = uv_path()
    for name, project in PROJECTS.items():
        check(run([uv, "build", "--wheel", "--quiet", "--out-dir", str(out), str(project)], REPO))
        assert list(out.glob(f"{name.replace('-', '_')}-*.whl")), f"no wheel for {name}"


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cwd")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A real Slurm on this host (two nodes on 127.0.0.1): the environment for its commands.
    Skipped only where slurm-wlm is not installed."""
    from primus.testing.slurm import local_cluster, missing

    if reason := missing():
        pytest.skip(reason)
    with local_cluster(tmp_path_factory.mktemp("slurm")) as env:
        yield env


@pytest.fixture(scope="module")
def cached_schemas() -> None:
    """Every backend's parameter schema in the test session's cache, read in this process
    (which imports the upstreams), as the first `config validate` after an install does."""
    from primus.core.config.schema_cache import schema_of
    from primus.core.runtime import resolution

    for backend in ("megatron", "torchtitan", "maxtext"):
        config = REPO / "configs" / backend / "tiny-cpu.yaml"
        module = next(iter(resolution.load(config).modules.values()))
        schema_of(resolution.adapter_class(module.framework)(module.framework))
