"""The helper scripts that sit beside a backend's tests (`python SCRIPT ARGS`), as modules of the
test process: pytest's importlib mode puts no test folder on `sys.path`.

    forward = script(Path(__file__).with_name("megatron_forward.py"))
    run_script_here(forward, str(jobs))
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType


def script(path: Path) -> ModuleType:
    """The script at `path`, imported as a module of its file's stem (its `__main__` block not
    run)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script_here(module: ModuleType, *args: str) -> None:
    """`python SCRIPT ARGS` in the test process: the script's `main(*args)`, as a one-process
    run in process (`in_process`); the environment, every patched upstream name and
    Megatron's process-wide state put back afterwards, and torch.distributed's process group
    ended where the script failed before ending it."""
    import torch.distributed as dist

    from primus.core.patches import restore_all
    from primus.testing.in_process import in_process, reset_upstreams

    saved = dict(os.environ)
    try:
        with in_process():
            module.main(*args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        restore_all()
        reset_upstreams()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
