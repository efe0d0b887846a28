"""The `primus` commands of the run helpers (`runs`, `sft_runs`) in the test process instead of
a subprocess, for a single-process run or export whose outputs (losses, checkpoints, exports)
a test reads: torch and the upstream are not started again for each.

    with in_process(sft_runs):
        run = posttrain(exp, "training.steps=2")

Keep a subprocess where the process boundary is under test: several ranks, signals, the files
a process writes, the CLI's own output.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType


def primus_here(
    *args: str, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`runs.primus` through `run_in_process`: the exit code, stdout and stderr.
    What a run leaves in an upstream's process-wide state is reset after it (`reset_upstreams`),
    so that the next run in this process starts as a new process would."""
    from primus.testing.fuzz_runs import run_in_process

    try:
        done = run_in_process(list(args), cwd or Path.cwd(), dict(env))
    finally:
        reset_upstreams()
    return subprocess.CompletedProcess(["primus", *args], done.code, done.stdout, done.stderr)


def reset_upstreams() -> None:
    """Megatron's process-wide state, where a run imported it: its global args, timers and
    tokenizer (a second run's set_global_variables asserts they are unset), the parallel
    groups, the microbatch calculator and the rerun state machine."""
    if "megatron.training.global_vars" not in sys.modules:
        return
    from megatron.core import parallel_state
    from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator
    from megatron.core.rerun_state_machine import destroy_rerun_state_machine
    from megatron.training.global_vars import destroy_global_vars

    parallel_state.destroy_model_parallel()
    destroy_global_vars()
    destroy_rerun_state_machine()
    destroy_num_microbatches_calculator()


@contextlib.contextmanager
def in_process(*helpers: ModuleType) -> Iterator[None]:
    """Within: the `primus` of each module of `helpers` is `primus_here`. What a training
    process does for its own end stays out of the test process: no reaper forked to outlive
    it, its helper processes not shielded, the stop signals' handlers and what they recorded
    put back (else every process the test process starts later counts as signalled), and the
    log handlers the runs added to Primus's and the root logger (a run's log file) closed."""
    import pytest

    from primus.core.launch import helper_processes, reaper
    from primus.core.logging import get_logger
    from primus.core.reliability import preemption

    handlers = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
    told = os.environ.get(preemption.ENV)  # a signal's name, for the processes started later
    loggers = {logger: list(logger.handlers) for logger in (logging.getLogger(), get_logger())}
    try:
        with pytest.MonkeyPatch.context() as patch:
            for module in helpers:
                patch.setattr(module, "primus", primus_here)
            patch.setattr(reaper, "start_descendant_reaper", lambda: None)
            patch.setattr(helper_processes, "shield", lambda: None)
            for name in ("_received", "_received_at", "_setting_up", "_unsaved"):
                patch.setattr(preemption, name, getattr(preemption, name))
            yield
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        if told is None:
            os.environ.pop(preemption.ENV, None)
        else:
            os.environ[preemption.ENV] = told
        for logger, before in loggers.items():
            for added in [h for h in logger.handlers if h not in before]:
                logger.removeHandler(added)
                added.close()
