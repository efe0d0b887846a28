"""Preemption, as core keeps it for every backend, with the dummy backend
(whose `dummy.preemption` patch is the reference): SIGTERM or SIGUSR1 to the launcher, to one
worker, or to a single-process run ends it with a checkpoint, exit code 75, the run dir's
preempted.json and a resume hint. Real signals to real `primus train` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from primus.core.reliability import preemption
from primus.core.reliability.preemption import ENV, EXIT_PREEMPTED, marked
from primus.testing.faults import (
    PYTHON,
    UV,
    UV_RUN,
    interrupt,
    slow_worker_start,
    starting_workers,
)
from primus.testing.processes import left_alive
from primus.testing.runs import primus

pytestmark = pytest.mark.slow

DUMMY_QUICKSTART = Path(__file__).parent / "fixtures" / "dummy-quickstart.yaml"


def training(run_dir: Path) -> int:
    """1 once the dummy trainer's loop has started (its log says so), else 0."""
    log = run_dir / "logs" / "rank-0.log"
    return int(log.is_file() and "lifecycle: trainer.train" in log.read_text())


def endless(tmp_path: Path, nproc: int) -> list[str]:
    return [
        "train", "pretrain", "--config", str(DUMMY_QUICKSTART), f"workspace={tmp_path}",
        "--nproc-per-node", str(nproc), "train_iters=1000000000", "log_interval=1000000000",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("sig", "nproc", "to_rank", "prefix"),
    [
        (signal.SIGTERM, 1, None, PYTHON),
        (signal.SIGUSR1, 1, None, PYTHON),
        (signal.SIGINT, 1, None, UV_RUN),
        (signal.SIGTERM, 2, None, PYTHON),
        (signal.SIGUSR1, 2, None, PYTHON),
        (signal.SIGTERM, 2, 1, PYTHON),
        (signal.SIGINT, 2, None, UV_RUN),
        (signal.SIGTERM, 2, "everyone", UV_RUN),
    ],
    ids=[
        "term-one-process",
        "usr1-one-process",
        "int-uv-run-one-process",
        "term-launcher",
        "usr1-launcher",
        "term-rank-1",
        "int-uv-run-launcher",
        "term-every-process-under-uv-run",
    ],
)
def test_a_preemption_signal_ends_the_run_with_a_checkpoint_and_exit_75(
    tmp_path: Path, sig: signal.Signals, nproc: int, to_rank: int | str | None, prefix: list[str]
) -> None:
    if prefix is UV_RUN and UV is None:
        pytest.skip("needs uv")
    run_dir = tmp_path / "local" / "local" / "quickstart"
    command = endless(tmp_path, nproc)
    run = interrupt(
        command, run_dir, sig, at_step=1, to_rank=to_rank, prefix=prefix, ready=training
    )
    assert run.returncode == EXIT_PREEMPTED, run.stderr[-3000:]
    assert run.marker is not None and run.marker["signal"] == sig.name
    assert run.marker["step"] > 0
    assert Path(run.marker["checkpoint"]).is_file()
    assert f"preempted: {sig.name} at step" in run.stderr
    assert "run the same command again to resume" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_run_that_ends_normally_leaves_no_marker(tmp_path: Path) -> None:
    """An earlier run's preempted.json goes when the run starts again."""
    run_dir = tmp_path / "local" / "local" / "quickstart"
    run_dir.mkdir(parents=True)
    (run_dir / "preempted.json").write_text('{"step": 3}')
    run = primus("train", "pretrain", "--config", str(DUMMY_QUICKSTART), f"workspace={tmp_path}")
    assert run.returncode == 0, run.stderr[-3000:]
    assert marked(run_dir) is None


def _before_training(tmp_path: Path, nproc: int) -> subprocess.CompletedProcess[str]:
    """A run whose process started after a SIGUSR1 (the variable the handler sets for the
    processes started from then on), as a launcher or a worker does whose set-up the signal
    interrupted."""
    return primus(
        "train", "pretrain", "--config", str(DUMMY_QUICKSTART), f"workspace={tmp_path}",
        "--nproc-per-node", str(nproc), **{ENV: "SIGUSR1"},
    )  # fmt: skip


def test_a_signal_during_set_up_stops_the_run_before_its_first_step_with_exit_75(
    tmp_path: Path,
) -> None:
    run = _before_training(tmp_path, nproc=1)
    assert run.returncode == EXIT_PREEMPTED, run.stderr[-3000:]
    assert "preempted: SIGUSR1 before the first step: nothing new to save" in run.stderr
    run_dir = tmp_path / "local" / "local" / "quickstart"
    mark = marked(run_dir)
    assert mark is not None and (mark["step"], mark["checkpoint"]) == (None, None)
    assert not (run_dir / "checkpoints").exists()
    assert "Traceback" not in run.stderr


def test_a_launcher_signalled_before_its_workers_start_starts_none_and_exits_75(
    tmp_path: Path,
) -> None:
    run = _before_training(tmp_path, nproc=2)
    assert run.returncode == EXIT_PREEMPTED, run.stderr[-3000:]
    assert "[primus] preempted by SIGUSR1 before the workers started" in run.stderr
    assert "torchrun" not in run.stderr and "spawning" not in run.stderr
    mark = marked(tmp_path / "local" / "local" / "quickstart")  # a Slurm job requeues on it
    assert mark is not None and (mark["step"], mark["signal"]) == (None, "SIGUSR1")


def test_launchers_of_two_nodes_signalled_before_their_workers_start_all_stop_alike(
    tmp_path: Path,
) -> None:
    """Slurm signals every node; a node whose launcher started no worker would leave the other
    node's workers waiting at the rendezvous until killed. Each node starts its workers, which
    stop before their first step, and says so."""
    from primus.core.launch.ports import free_port

    port = str(free_port())
    train = [*PYTHON, "train", "pretrain", "--config", str(DUMMY_QUICKSTART),
             f"workspace={tmp_path}", "--nnodes", "2", "--master-addr", "127.0.0.1",
             "--master-port", port]  # fmt: skip
    env = {**os.environ, ENV: "SIGUSR1"}
    launchers = [
        subprocess.Popen(
            [*train, f"--node-rank={rank}"], env=env, stderr=subprocess.PIPE, text=True
        )
        for rank in (0, 1)
    ]
    said = [launcher.communicate(timeout=300)[1] for launcher in launchers]
    for launcher, stderr in zip(launchers, said, strict=True):
        assert launcher.returncode == EXIT_PREEMPTED, stderr[-3000:]
        assert "preempted by SIGUSR1 before the first step; run the same command again" in stderr
    mark = marked(tmp_path / "local" / "local" / "quickstart")
    assert mark is not None and mark["step"] is None


def test_the_signal_handler_tells_the_processes_started_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In this process: the handler `watch` installs records the signal in the environment."""
    monkeypatch.setattr(preemption, "_received", None)
    monkeypatch.delenv(ENV, raising=False)
    handlers = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
    try:
        preemption.watch()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert preemption.requested() == "SIGUSR1"
        assert os.environ[ENV] == "SIGUSR1"
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.environ.pop(ENV, None)


def test_a_rank_names_the_signal_the_ranks_agreed_on(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """In this process: a rank that got no signal itself takes the agreed one as its own,
    silently (the marker and messages then name it); one that got its own keeps it."""
    monkeypatch.setattr(preemption, "_received", None)
    monkeypatch.delenv(ENV, raising=False)
    try:
        asked: list[int] = []

        def largest(value: int) -> float:  # the other ranks' largest, as a collective gives
            asked.append(value)
            return float(max(value, other))

        other = 0
        assert preemption.agreed(largest) == 0 and preemption.requested() is None
        other = int(signal.SIGUSR1)
        assert preemption.agreed(largest) == signal.SIGUSR1
        assert preemption.requested() == "SIGUSR1"
        other = int(signal.SIGTERM)
        assert preemption.agreed(largest) == signal.SIGTERM  # the largest, agreed
        assert preemption.requested() == "SIGUSR1"  # its own first one stays
        assert asked == [0, 0, int(signal.SIGUSR1)]  # each rank gives its own number
        assert capfd.readouterr().err == ""
    finally:
        os.environ.pop(ENV, None)


def test_only_the_watched_process_announces_the_signal(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A process forked from a worker (a data loader, a saver) notes a signal sent to every
    process of the run but leaves the announcement to the worker: one line per worker."""
    monkeypatch.setattr(preemption, "_received", None)
    monkeypatch.delenv(ENV, raising=False)
    handlers = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
    try:
        preemption.watch()
        child = os.fork()
        if child == 0:  # the forked process: its inherited handler notes, and says nothing
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(0 if preemption.requested() == "SIGTERM" else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) == 0
        assert "received" not in capfd.readouterr().err
        os.kill(os.getpid(), signal.SIGTERM)
        assert capfd.readouterr().err.count("[primus] SIGTERM received") == 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.environ.pop(ENV, None)


def test_a_signal_during_set_up_says_the_run_stops_before_its_first_step(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Ctrl-C while the model builds: no step is running, so none is finished and saved; the
    run stops where set-up ends. Once training started, the stop follows the current step."""
    monkeypatch.delenv(ENV, raising=False)
    handlers = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
    said = []
    try:
        for in_set_up in (True, False):
            monkeypatch.setattr(preemption, "_received", None)
            os.environ.pop(ENV, None)  # what the last signal told the processes started after it
            preemption.watch()
            with preemption.stopping_before_training(tmp_path, 0):
                if not in_set_up:
                    preemption.training_starts(tmp_path, 0)  # no signal yet: training goes on
                os.kill(os.getpid(), signal.SIGINT)
            said.append(capfd.readouterr().err)
        with pytest.raises(preemption.Preempted):  # the signal came: set-up's end stops the run
            preemption.training_starts(tmp_path, 0)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.environ.pop(ENV, None)
    assert said == [
        "[primus] SIGINT received during set-up: stopping before the first step"
        " (Ctrl-C again to abort)\n",
        "[primus] SIGINT received: stopping after this step with a checkpoint"
        " (Ctrl-C again to abort)\n",
    ]
    mark = marked(tmp_path)
    assert mark is not None and (mark["step"], mark["checkpoint"]) == (None, None)


def test_a_signal_that_arrives_while_the_first_is_handled_is_not_announced_again(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The launcher passes on a SIGTERM that its workers got too: the copy can arrive while the
    worker's handler of the first still runs (Python runs the second handler inside it). Here
    it arrives inside the handler's first call: one announcement, not two."""
    monkeypatch.setattr(preemption, "_received", None)
    monkeypatch.delenv(ENV, raising=False)
    clock = preemption.time.monotonic
    sent = []

    def second_signal_meanwhile() -> float:
        if not sent:
            sent.append(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
        return clock()

    handlers = {sig: signal.getsignal(sig) for sig in preemption.SIGNALS}
    try:
        preemption.watch()
        monkeypatch.setattr(preemption.time, "monotonic", second_signal_meanwhile)
        os.kill(os.getpid(), signal.SIGTERM)
        monkeypatch.setattr(preemption.time, "monotonic", clock)
        assert sent and preemption.requested() == "SIGTERM"
        assert capfd.readouterr().err.count("[primus] SIGTERM received") == 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        os.environ.pop(ENV, None)


def test_a_crashed_worker_fails_the_launch_though_the_others_stopped_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "local" / "local" / "quickstart"
    run = interrupt(
        endless(tmp_path, 2), run_dir, signal.SIGKILL, at_step=1, to_rank=1, ready=training
    )
    assert run.returncode == 1, run.stderr[-3000:]
    last = run.stderr.rstrip().splitlines()[-2:]  # the launcher's verdict, no "preempted"
    assert last == [
        "[primus] rank 0 stopped as on a stop signal (exit 75)",  # torchrun stopped it
        "[primus] a worker failed: rank 1 was killed by SIGKILL",
    ]
    assert run.left == []


def test_a_worker_notes_a_stop_signal_from_the_first_line_of_the_cli() -> None:
    """A worker of a Primus launcher (PRIMUS_LAUNCHER_PID set) watches for the stop signals as
    the CLI starts, before any command: one its launcher passes on while the worker is still
    starting is noted, not fatal (SIGUSR1's default action ends the process silently), and
    said to stop the run before its first step."""
    program = (
        "import os, signal\n"
        "from primus.cli.main import main\n"
        "try:\n"
        "    main(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "print('still here')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (ENV, "LOCAL_RANK")}
    env["PRIMUS_LAUNCHER_PID"] = str(os.getpid())
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.endswith("still here\n")
    assert "[primus] SIGUSR1 received during set-up: stopping before the first step" in done.stderr


def test_ctrl_c_while_the_workers_start_stops_the_run_before_its_first_step(
    tmp_path: Path,
) -> None:
    """A terminal's Ctrl-C (SIGINT to the launcher's process group; the workers lead their own)
    while the workers' interpreters start: the launcher passes it on, and each worker notes it
    once it watches (it started with the signal held) instead of dying of a KeyboardInterrupt
    traceback; the run stops before its first step, exit 75."""
    env = {**os.environ, **slow_worker_start(tmp_path)}
    run = subprocess.Popen(
        [*PYTHON, *endless(tmp_path, 2)], env=env, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    workers = starting_workers(tmp_path, 2)
    os.killpg(run.pid, signal.SIGINT)
    err = run.communicate(timeout=120)[1]
    assert run.returncode == EXIT_PREEMPTED, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.count("SIGINT received during set-up: stopping before the first step") == 2
    assert "[primus] preempted by SIGINT before the first step; run the same command" in err
    mark = marked(tmp_path / "local" / "local" / "quickstart")
    assert mark is not None and (mark["step"], mark["signal"]) == (None, "SIGINT")
    assert left_alive(workers, timeout_s=5) == []
