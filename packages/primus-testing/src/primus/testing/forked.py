"""The `primus` commands of the run helpers (`runs`, `sft_runs`) forked by a fork server
(`faults.Forks`) that imported the upstream once, for one-process runs whose outputs a test
reads: each is still a process of its own (its JAX backend, its signal handlers, its reaper),
without the seconds of its imports.

    with Forks("maxtext.trainers.pre_train.train") as forks, forked(forks, runs):
        run_dir = train_run(recipe, workspace, "exp_name=a", "steps=4")

Keep a subprocess where the imports or the launch are under test: several ranks, uv, what a
process imports or writes outside its run directory.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from primus.testing.faults import Forks


@contextlib.contextmanager
def forked(forks: Forks, *helpers: ModuleType) -> Iterator[None]:
    """Within: the `primus` of each module of `helpers` runs its command forked by `forks`
    (exit code, stdout and stderr, as `runs.primus` gives them)."""
    import pytest

    def primus(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        return forks.run(list(args), env, cwd=cwd)

    with pytest.MonkeyPatch.context() as patch:
        for module in helpers:
            patch.setattr(module, "primus", primus)
        yield
