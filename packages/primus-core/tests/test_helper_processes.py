"""A training process's helpers and its end, with real processes and real signals: helpers
ignore the stop signals that reach a whole job; Ctrl-C stops at a step and twice aborts, and is
one line before the CLI can handle it; a run killed by SIGKILL leaves nothing it started behind,
and nothing else is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus.testing.faults import descendants
from primus.testing.processes import alive, left_alive

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc and prctl"),
]

# A run-like process: Primus's handlers, shield and reaper as `primus train` sets them up, then
# helpers of every kind, each writing its pid into the folder (argv[1]) once it runs.
RUN = """
import multiprocessing, os, subprocess, sys, time
from pathlib import Path
from primus.core.launch import helper_processes, reaper
from primus.core.reliability import preemption

folder = Path(sys.argv[1])


def mark(kind):
    (folder / f"{kind}-{os.getpid()}").touch()


def helper(kind):
    mark(kind)
    time.sleep(120)


if __name__ == "__main__":
    preemption.watch()
    helper_processes.shield()
    reaper.start_descendant_reaper()
    multiprocessing.get_context("spawn").Process(target=helper, args=("spawned",)).start()
    multiprocessing.get_context("fork").Process(target=helper, args=("forked",)).start()
    if "--loader" in sys.argv:  # PyTorch's data-loader workers set their own SIGTERM handler
        import torch.utils.data

        class Forever(torch.utils.data.IterableDataset):
            def __iter__(self):
                mark("loader")
                while True:
                    time.sleep(0.1)
                    yield 0

        loader = iter(torch.utils.data.DataLoader(Forever(), num_workers=1, batch_size=None))
        next(loader)
    plain = subprocess.Popen(["sleep", "120"])
    (folder / f"plain-{plain.pid}").touch()
    mark("run")
    while True:
        time.sleep(0.1)
        if preemption.requested():
            print("requested", preemption.requested(), flush=True)
"""

KINDS = {"run", "spawned", "forked", "plain"}


def start(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[str], dict[str, int]]:
    folder = tmp_path / "pids"
    folder.mkdir()
    script = tmp_path / "run.py"
    script.write_text(RUN)
    run = subprocess.Popen(
        [sys.executable, str(script), str(folder), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    kinds = KINDS | ({"loader"} if "--loader" in flags else set())
    deadline = time.monotonic() + 60
    while len(pids := by_kind(folder)) < len(kinds) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(pids) == kinds, pids
    return run, pids


def by_kind(folder: Path) -> dict[str, int]:
    return {p.name.split("-")[0]: int(p.name.split("-")[1]) for p in folder.iterdir()}


def test_helpers_ignore_the_stop_signal_that_reaches_every_process(tmp_path: Path) -> None:
    """SIGTERM to every process at once (Slurm, systemd): the run notes it and goes on, its
    helpers (forked, spawned, a PyTorch data-loader worker) ignore it; a plain subprocess
    keeps its default and dies."""
    run, pids = start(tmp_path, "--loader")
    try:
        for pid in [run.pid, *descendants(run.pid)]:
            os.kill(pid, signal.SIGTERM)
        time.sleep(2)
        assert not alive(pids["plain"])
        assert [kind for kind in ("run", "spawned", "forked", "loader") if not alive(pids[kind])] == []  # fmt: skip
    finally:
        run.kill()
    assert "SIGTERM received: stopping after this step with a checkpoint" in run.communicate()[1]
    assert left_alive(list(pids.values()), timeout_s=5) == []


# A shielded process starts spawned helpers and signals each while its interpreter starts, as a
# signal to the whole job does when it lands on a helper's first milliseconds (Megatron's
# checkpoint writer starts a multiprocessing Manager at its first save): each must live on.
STARTING = """
import multiprocessing, os, signal, time
from primus.core.launch import helper_processes
from primus.core.reliability import preemption

if __name__ == "__main__":
    preemption.watch()
    helper_processes.shield()
    codes = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        helper = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(0.5,))
        helper.start()
        os.kill(helper.pid, sig)
        helper.join()
        codes.append(helper.exitcode)
    print(codes, flush=True)
"""


def test_a_spawned_helper_signalled_while_it_starts_lives_on(tmp_path: Path) -> None:
    script = tmp_path / "starting.py"
    script.write_text(STARTING)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "[0, 0, 0]\n"  # each slept its half second and exited 0


def test_a_run_killed_by_sigkill_leaves_nothing_it_started(tmp_path: Path) -> None:
    """Within 5 s of the SIGKILL: the spawned and forked helpers, the plain subprocess and
    multiprocessing's resource tracker are gone; a process of the same group that the run did
    not start (a sibling in a job script) is left alone."""
    run, pids = start(tmp_path)
    started = [p for p in descendants(run.pid) if p not in pids.values()]  # tracker, reaper
    sibling = subprocess.Popen(["sleep", "60"])
    try:
        run.kill()
        run.wait()
        assert left_alive([*pids.values(), *started], timeout_s=5) == []
        assert sibling.poll() is None
    finally:
        sibling.kill()
        sibling.wait()


def test_ctrl_c_stops_at_the_step_and_twice_aborts(tmp_path: Path) -> None:
    """One SIGINT (and a copy of it within 0.5 s, as uv passes on what the group got) asks for
    a stop at the step; another one a second later aborts: the process dies of SIGINT (130)."""
    run, pids = start(tmp_path)
    run.send_signal(signal.SIGINT)
    run.send_signal(signal.SIGINT)  # the same Ctrl-C, passed on
    assert run.stdout is not None and run.stdout.readline() == "requested SIGINT\n"
    time.sleep(1.0)
    assert run.poll() is None
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=10) == -signal.SIGINT
    err = run.communicate()[1]
    assert "SIGINT received: stopping after this step with a checkpoint (Ctrl-C again to abort)" in err  # fmt: skip
    assert "SIGINT again: aborting without a checkpoint" in err
    assert left_alive(list(pids.values()), timeout_s=5) == []


def python(program: str, unset: str) -> subprocess.CompletedProcess[str]:
    """`python -c program`, the variable `unset` left out of its environment."""
    env = {k: v for k, v in os.environ.items() if k != unset}
    return subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_a_copy_of_the_stop_signal_while_python_shuts_down_keeps_the_exit_code() -> None:
    """A run stopped by a SIGINT exits 75; uv passes on the SIGINT the process group got 0.2 s
    later, and a copy that lands while Python shuts down (its handlers gone) would end the
    process by SIGINT instead (exit 130). Here it lands at the last object's clean-up."""
    program = (
        "import os, signal, sys\n"
        "from primus.core.reliability import preemption\n"
        "class Late:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "late = Late()\n"
        "preemption.watch()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.exit(75)\n"
    )
    done = python(program, "PRIMUS_PREEMPTED")
    assert done.returncode == 75, done.stderr[-2000:]


def test_ctrl_c_before_the_cli_can_handle_it_is_one_line() -> None:
    """Ctrl-C while Python still imports the CLI (its first tenth of a second, before any
    command handles it): one line, no traceback; the process ends by SIGINT (exit 130)."""
    program = (
        "import os, signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal\n"
        "import primus.cli\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "from primus.cli.main import main\n"
    )
    done = python(program, "PRIMUS_DEBUG")
    assert done.returncode == -signal.SIGINT, done.stderr[-2000:]
    assert done.stderr == "[primus] interrupted (Ctrl-C)\n"


def test_a_run_that_exits_with_its_data_loader_running_exits_cleanly(tmp_path: Path) -> None:
    """A failed run exits with a PyTorch data loader still held (by its error's traceback, say):
    multiprocessing's exit ends the SIGTERM-deaf workers with SIGKILL, and PyTorch's worker
    watch must not take that for a failure (a `RuntimeError: DataLoader worker ... is killed`
    traceback after the run's own message)."""
    script = tmp_path / "exits.py"
    script.write_text(
        "import sys, time, torch.utils.data\n"
        "from primus.core.launch import helper_processes\n"
        "from primus.core.reliability import preemption\n"
        "preemption.watch()\n"
        "helper_processes.shield()\n"
        "class Forever(torch.utils.data.IterableDataset):\n"
        "    def __iter__(self):\n"
        "        while True:\n"
        "            time.sleep(0.01)\n"
        "            yield 0\n"
        "held = iter(torch.utils.data.DataLoader(Forever(), num_workers=2, batch_size=None))\n"
        "next(held)\n"
        "print(*[w.pid for w in held._workers], flush=True)\n"
        "sys.exit(3)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 3, run.stderr[-3000:]
    assert "Traceback" not in run.stderr and "DataLoader worker" not in run.stderr, run.stderr
    assert left_alive([int(pid) for pid in run.stdout.split()], timeout_s=5) == []
