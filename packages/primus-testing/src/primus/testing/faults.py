"""Fault injection for the reliability tests: a real `primus train` subprocess, and a real signal
to its launcher or to one of its workers once the run has reached a given step."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from primus.core.launch.reaper import Process, processes
from primus.core.launch.reaper import descendants as below
from primus.core.metrics import read_metrics
from primus.core.reliability.preemption import EXIT_PREEMPTED, marked
from primus.testing.processes import left_alive


def parent_pids() -> dict[int, int]:
    """Pid -> parent pid of every process, from /proc."""
    return {pid: proc.ppid for pid, proc in processes().items()}


def descendants(pid: int, parents: dict[int, int] | None = None) -> list[int]:
    """Every process below `pid` (children, grandchildren, ...)."""
    table = {
        child: Process(child, parent, 0, 0) for child, parent in (parents or parent_pids()).items()
    }
    return sorted(below(table, {pid}))


def worker_rank(pid: int) -> int | None:
    """The RANK of a Primus worker process (`python -m primus.cli` with RANK set), else None."""
    try:
        if b"primus.cli" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return None
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(v[5:]) for v in env if v.startswith(b"RANK=")]
    return ranks[0] if ranks else None


def workers(launcher: int) -> dict[int, int]:
    """Rank -> pid of the Primus workers below `launcher`. A worker's reaper is its child with
    the same RANK; it is told apart by its parent, not by a later pid (pids wrap around)."""
    parents = parent_pids()
    ranks = {pid: worker_rank(pid) for pid in descendants(launcher, parents)}
    return {
        rank: pid
        for pid, rank in ranks.items()
        if rank is not None and ranks.get(parents.get(pid, 0)) != rank
    }


def steps_logged(run_dir: Path) -> int:
    """The last step in the run's metrics.jsonl (0 before the first; a torn last line, a
    record being written, left out)."""
    try:
        records = read_metrics(run_dir / "metrics.jsonl")
        return records[-1]["step"] if records else 0
    except (OSError, ValueError, KeyError):
        return 0


def _send(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a helper that ended meanwhile
            os.kill(pid, sig)


@dataclass
class Interrupted:
    """What a signalled run left: its exit code, output, the marker of `stop()`, and when
    (time.time()) the signal was sent and the run ended."""

    returncode: int
    stdout: str
    stderr: str
    marker: dict | None
    signalled_at: float
    ended_at: float
    left: list[int]  # of the processes the run had started at the signal, those alive 5 s on

    @property
    def preempted(self) -> bool:
        return self.returncode == EXIT_PREEMPTED and self.marker is not None


PYTHON = [sys.executable, "-m", "primus.cli"]  # how `interrupt` starts primus by default
UV = shutil.which("uv")
UV_RUN = [str(UV), "run", "--no-sync", "primus"]  # as users start it; needs uv (UV)


def signal_targets(top: int, to: int | str | None) -> list[int]:
    """Who gets the signal: the process started (`to` None), the worker of rank `to`, or, for
    `to="everyone"`, every process of the run at once, as Slurm and systemd signal a job: the
    process started, launcher, workers, their data loaders, savers and reapers."""
    if to == "everyone":
        return [top, *descendants(top)]
    return [top if to is None else workers(top)[int(to)]]


def interrupt(
    command: list[str],
    run_dir: Path,
    sig: signal.Signals,
    *,
    at_step: int,
    to_rank: int | str | None = None,
    again_after_s: float | None = None,
    prefix: list[str] = PYTHON,
    ready: Callable[[Path], int] = steps_logged,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
) -> Interrupted:
    """Run `primus COMMAND...` (through `prefix`: python -m, or UV_RUN); once `ready(run_dir)`
    (the last logged step) reaches `at_step`, send `sig` to `signal_targets(to_rank)`, and the
    same again `again_after_s` later (Ctrl-C twice) if given; wait for the run to end.
    `command` must keep the run going well past `at_step`."""
    environment = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"} | (env or {})
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([*prefix, *command], env=environment, stdout=out, stderr=err)
        try:
            deadline = time.monotonic() + timeout_s
            while ready(run_dir) < at_step and proc.poll() is None:
                assert time.monotonic() < deadline, f"step {at_step} not reached in {timeout_s} s"
                time.sleep(0.05)
            signalled_at = time.time()
            started = descendants(proc.pid)
            if proc.poll() is None:
                targets = signal_targets(proc.pid, to_rank)
                _send(targets, sig)
                if again_after_s is not None:
                    time.sleep(again_after_s)
                    _send(targets[:1], sig)
            proc.wait(timeout=timeout_s)
            ended_at = time.time()
        finally:
            if proc.poll() is None:
                proc.kill()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    assert ready(run_dir) >= at_step, f"the run ended before step {at_step}:\n{stderr[-4000:]}"
    left = left_alive(started, timeout_s=5)
    return Interrupted(
        proc.returncode, stdout, stderr, marked(run_dir), signalled_at, ended_at, left
    )


_FORK_SERVER = """
import importlib, json, os, sys
told = os.fdopen(os.dup(1), "w", buffering=1)  # the answers; what the imports print: stderr
os.dup2(2, 1)
for name in sys.argv[1:]:
    if name.startswith("!"):  # hidden, as the runtime hides a backend's unused_modules
        sys.modules[name[1:]] = None
    else:
        importlib.import_module(name)
from primus.cli.main import main
print("ready", file=told)
ended = {}  # pid -> exit code (negative: the signal), of the runs reaped
def reap(pid=-1, flags=os.WNOHANG):
    while True:
        try:
            done, status = os.waitpid(pid, flags)
        except ChildProcessError:
            return
        if done == 0:
            return
        ended[done] = os.waitstatus_to_exitcode(status)
        if pid != -1:
            return
for line in sys.stdin:
    job = json.loads(line)
    if "exit" in job:
        break
    if "wait" in job:
        if job["wait"] not in ended:
            reap(job["wait"], 0)
        print(ended.pop(job["wait"]), file=told)
        continue
    pid = os.fork()
    if pid == 0:
        told.close()
        os.setsid()
        os.environ.update(job["env"])
        if job.get("cwd"):
            os.chdir(job["cwd"])
        for name in job["reload"]:  # modules that read the run's environment when imported
            importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
        for fd, path in enumerate([os.devnull, job["stdout"], job["stderr"]]):
            os.dup2(os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), fd)
        code = 1
        try:
            main(job["argv"])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(pid, file=told)
    reap()  # the runs that ended (a killed run, once it is one)
"""


class Forks:
    """A process that has imported `primus.cli` and `imports` (torch, the upstream) once and
    forks each run `start` asks of it: every run is a process of its own, in a session of its
    own, without the seconds of its imports. A run that ended or was killed stays a zombie
    (not `alive`) until the next `start`, `wait` or `close`.

        with Forks("megatron.training.training") as forks:
            pid = forks.start(["train", "pretrain", ...], {"PRIMUS_WORKSPACE": ...})
            done = forks.run(["train", "pretrain", ...], {...})  # started and waited for
    """

    def __init__(
        self, *imports: str, env: dict[str, str] | None = None, hidden: tuple[str, ...] = ()
    ) -> None:
        """`env`: added to this process's environment (less PRIMUS_PATCHES) for the server and
        every run it forks. `hidden`: modules made unimportable first, as a run of a backend
        whose adapter lists them in `unused_modules` has them."""
        environment = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"}
        argv = [*(f"!{name}" for name in hidden), *imports]
        self.server = subprocess.Popen(
            [sys.executable, "-c", _FORK_SERVER, *argv], env=environment | (env or {}),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.server.stdin is not None and self.server.stdout is not None
        self.to, self.told = self.server.stdin, self.server.stdout
        assert self.told.readline() == "ready\n", "the fork server did not start"

    def _ask(self, job: dict) -> int:
        self.to.write(json.dumps(job) + "\n")
        self.to.flush()
        return int(self.told.readline())

    def start(
        self, argv: list[str], env: dict[str, str], stdout: Path | None = None,
        stderr: Path | None = None, reload: tuple[str, ...] = (), cwd: Path | None = None,
    ) -> int:  # fmt: skip
        """Fork `primus ARGV` with `env` added to the environment and the modules `reload`
        imported again in it (a sitecustomize.py that reads the environment), its output
        appended to `stdout` and `stderr` (default: discarded), in `cwd` (default: the
        server's); its pid."""
        out, err = (str(path or os.devnull) for path in (stdout, stderr))
        job = {"argv": argv, "env": env, "stdout": out, "stderr": err, "reload": list(reload),
               "cwd": str(cwd or "")}  # fmt: skip
        return self._ask(job)

    def wait(self, pid: int) -> int:
        """The exit code of run `pid` once it ended (negative: the signal that ended it)."""
        return self._ask({"wait": pid})

    def run(
        self, argv: list[str], env: dict[str, str], reload: tuple[str, ...] = (),
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """`primus ARGV` forked (as `start`) and waited for: exit code and output, as
        `runs.primus` gives them."""
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            code = self.wait(self.start(argv, env, out, err, reload, cwd))
            return subprocess.CompletedProcess(
                ["primus", *argv], code, out.read_text(), err.read_text()
            )

    def close(self) -> None:
        """Tell the server to end (not by closing its stdin: a process forked from this one,
        a reaper, may hold the pipe open) and wait for it."""
        with contextlib.suppress(BrokenPipeError):  # it ended already
            self.to.write(json.dumps({"exit": True}) + "\n")
            self.to.close()
        self.server.wait(timeout=60)

    def __enter__(self) -> Forks:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


_SLOW_START = """
import os, time
if "PRIMUS_LAUNCHER_PID" in os.environ and "LOCAL_RANK" in os.environ:  # a launcher's worker
    open(os.path.join({folder!r}, "starting-" + str(os.getpid())), "w").close()
    time.sleep({seconds!r})
"""


def slow_worker_start(folder: Path, seconds: float = 1.0) -> dict[str, str]:
    """The environment (PYTHONPATH) under which each worker of a Primus launcher, while its
    interpreter starts (before any of Primus runs), writes `folder`/starting-<pid> and sleeps
    `seconds`: a signal sent once `starting_workers` lists them lands in that window."""
    site = folder / "slow-start"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SLOW_START.format(folder=str(folder), seconds=seconds))
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def starting_workers(folder: Path, count: int, timeout_s: float = 120) -> list[int]:
    """The pids of the `count` workers `slow_worker_start` holds, once they are all there."""
    deadline = time.monotonic() + timeout_s
    while len(pids := [int(p.name.split("-")[1]) for p in folder.glob("starting-*")]) < count:
        assert time.monotonic() < deadline, f"{len(pids)} of {count} workers started"
        time.sleep(0.02)
    return pids
