"""Primus's own spawner (the `spawn` launcher): torchrun's variables, no torch, fail fast."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.errors import PrimusError
from primus.core.launch.launcher import Launch, how_it_ended
from primus.core.launch.spawner import spawn, worker_env
from primus.core.launch.torchrun import failed_launch_code
from primus.core.launch.workers import launch_workers
from primus.testing.faults import slow_worker_start, starting_workers
from primus.testing.processes import alive, left_alive

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_worker_env_is_torchruns() -> None:
    assert worker_env(Launch(4, nnodes=2, node_rank=1), 1, addr="h0", port=9) == {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "h0",
        "MASTER_PORT": "9",
    }


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def dump_env(folder: Path) -> list[str]:
    """A worker that writes its launch variables to folder/<RANK>."""
    return python(
        f"import json, os; json.dump({{k: os.environ[k] for k in {VARIABLES!r}}}, "
        f"open({str(folder)!r} + '/' + os.environ['RANK'], 'w'))"
    )


@pytest.mark.slow
def test_each_worker_gets_its_rank_and_a_shared_free_port(tmp_path: Path) -> None:
    assert spawn(dump_env(tmp_path), Launch(3, nnodes=2, node_rank=1, master_addr="h0")) == 0
    seen = [json.loads((tmp_path / str(rank)).read_text()) for rank in (3, 4, 5)]
    assert [(s["RANK"], s["LOCAL_RANK"]) for s in seen] == [("3", "0"), ("4", "1"), ("5", "2")]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["MASTER_ADDR"]) for s in seen} == {
        ("6", "3", "h0")
    }
    assert {s["MASTER_PORT"] for s in seen} == {"29500"}  # several nodes: the default port
    one_node = tmp_path / "one"
    one_node.mkdir()
    assert spawn(dump_env(one_node), Launch(2)) == 0
    ports = {json.loads((one_node / rank).read_text())["MASTER_PORT"] for rank in ("0", "1")}
    assert len(ports) == 1 and ports != {"29500"}  # one node: one free port for all


@pytest.mark.slow
@pytest.mark.parametrize(("worker_code", "launch_code"), [(3, 1), (2, 2)])
def test_one_failing_worker_stops_the_others(
    capfd: pytest.CaptureFixture[str], worker_code: int, launch_code: int
) -> None:
    """A worker's bad-config exit (2) stays 2; any other failure is 1."""
    code = f"import os, sys, time; sys.exit({worker_code}) if os.environ['RANK'] == '1' else time.sleep(120)"
    start = time.monotonic()
    assert spawn(python(code), Launch(2), grace_s=2) == launch_code
    assert time.monotonic() - start < 30
    assert (
        f"a worker failed: rank 1 exited with code {worker_code}; stopping the others"
        in capfd.readouterr().err
    )


def reach_together(folder: Path, config: str) -> list[str]:
    """A worker that waits for both ranks, runs `primus train pretrain --config <config>` (a
    Python expression) and, once it returns, waits for the other rank's to return before it
    exits: the spawner stops the other worker at the first failure, so without the wait the
    second might not get to report (however slow the machine)."""
    return python(
        "import os, sys, time; from pathlib import Path; from primus.cli.main import main\n"
        f"folder = Path({str(folder)!r}); rank = os.environ['RANK']\n"
        "def meet(stage):\n"
        "    (folder / f'{stage}-{rank}').touch()\n"
        "    while len(list(folder.glob(f'{stage}-*'))) < 2: time.sleep(0.01)\n"
        "meet('start')\n"
        f"try: main(['train', 'pretrain', '--config', {config}])\n"
        "except SystemExit: meet('done'); raise"
    )


def test_an_error_every_worker_reaches_is_printed_once(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Each rank of `primus train --nproc-per-node 2` reaches the same config error: the console
    shows it once. Errors that differ between ranks are each shown."""
    same, differ = tmp_path / "same", tmp_path / "differ"
    same.mkdir(), differ.mkdir()
    assert spawn(reach_together(same, repr(f"{tmp_path}/missing.yaml")), Launch(2)) == 2
    assert capfd.readouterr().err.count("error: config file not found: ") == 1
    per_rank = f"{str(tmp_path)!r} + '/missing-' + os.environ['RANK'] + '.yaml'"
    assert spawn(reach_together(differ, per_rank), Launch(2)) == 2
    err = capfd.readouterr().err
    assert all(f"config file not found: {tmp_path}/missing-{rank}.yaml" in err for rank in (0, 1))
    assert not list(Path(tempfile.gettempdir()).glob(f"primus-{os.getpid()}-reported*"))


@pytest.mark.slow
def test_signals_while_stopping_leave_no_worker_behind(tmp_path: Path) -> None:
    """Workers that ignore SIGTERM (as JAX's do) are killed even when the launcher is
    signalled again while it waits for them."""
    worker = (
        "import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(tmp_path)!r} + '/' + str(os.getpid()), 'w').close(); time.sleep(120)"
    )
    launcher = (  # SIGINT as in a foreground process: a background shell job inherits it ignored
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from primus.core.launch.launcher import Launch; from primus.core.launch.spawner import spawn; "
        f"sys.exit(spawn([sys.executable, '-c', {worker!r}], Launch(2), grace_s=3))"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher])
    deadline = time.monotonic() + 60
    while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 2
    parent.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    parent.send_signal(signal.SIGTERM)  # while it waits for the workers to stop
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=30) != 0
    time.sleep(0.5)
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


class MpiAdapter(BackendAdapter):
    launcher = "mpirun"

    def convert_config(self, config: Any) -> None: ...

    def load_trainer_class(self, stage: str = "pretrain") -> Any: ...


def test_an_unknown_launcher_is_an_error() -> None:
    with pytest.raises(TypeError, match=r"MpiAdapter\.launcher must be one of torchrun, spawn"):
        BackendRegistry.register_adapter("mpi", MpiAdapter)  # checked when registered
    with pytest.raises(PrimusError, match="unknown launcher 'mpirun'"):
        launch_workers("mpirun", ["train"], Launch(2))


def wait_for_files(folder: Path, count: int, timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(list(folder.iterdir())) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return [int(p.name) for p in folder.iterdir()]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="death signals are Linux's")
def test_a_launcher_killed_by_sigkill_leaves_no_worker_nor_what_it_forked(tmp_path: Path) -> None:
    """SIGKILL to the spawn launcher: its workers die (death signal), and so do the processes
    the workers started, forked or through multiprocessing's spawn (as Megatron's checkpoint
    savers and data loaders are)."""
    worker = (
        "import multiprocessing, os, time\n"
        "def mark():\n"
        f"    open({str(tmp_path)!r} + '/' + str(os.getpid()), 'w').close()\n"
        "def wait():\n"
        "    mark()\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    from primus.core.launch.launcher import bind_worker_to_launcher\n"
        "    bind_worker_to_launcher()\n"
        "    multiprocessing.get_context('spawn').Process(target=wait).start()\n"
        "    os.fork()\n"
        "    wait()\n"
    )
    script = tmp_path.parent / f"{tmp_path.name}-worker.py"
    script.write_text(worker)
    launcher = (
        "import sys; from primus.core.launch.launcher import Launch; from primus.core.launch.spawner import spawn; "
        f"sys.exit(spawn([sys.executable, {str(script)!r}], Launch(2)))"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher])
    pids = wait_for_files(tmp_path, 6)  # two workers, a forked and a spawned child each
    assert len(pids) == 6
    parent.kill()
    parent.wait()
    assert left_alive(pids) == []


def test_a_taken_rendezvous_port_is_replaced(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The free-port race: another process binds the port Primus chose before torchrun does.
    torchrun fails with EADDRINUSE, and the launch tries again on another free port."""
    import socket

    from primus.core.launch import launcher

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real = launcher.free_port
        monkeypatch.setattr(launcher, "free_port", lambda: next(ports, None) or real())
        assert launch_workers("torchrun", ["--help"], Launch(1)) == 0
    assert "the rendezvous port was taken" in capfd.readouterr().err


ON_SIGNAL = {  # what a worker does on the signal: save and exit 75, die of it, exit 1 unsaved
    "save": "lambda *_: (time.sleep(1), open(f'{folder}/' + os.environ['RANK'], 'w'), sys.exit(75))",
    "die": "signal.SIG_DFL",
    "unsaved": "lambda *_: sys.exit(1)",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "worker_does"),
    [(signal.SIGTERM, "save"), (signal.SIGUSR1, "save"), (signal.SIGTERM, "die"),
     (signal.SIGUSR1, "die"), (signal.SIGINT, "unsaved")],
    ids=["sigterm-save", "sigusr1-save", "sigterm-die", "sigusr1-die", "sigint-unsaved"],
)  # fmt: skip
def test_a_preemption_signal_reaches_every_worker_and_the_spawner_waits_for_them(
    tmp_path: Path, sig: signal.Signals, worker_does: str
) -> None:
    """The spawner passes the stop signals on and waits while the workers save (exit 75: it
    exits 75); a worker the signal kills, or that ends without a checkpoint (exit 1: its
    backend saves none), makes it exit 128 + the signal, as torchrun's launcher does."""
    saving_s = worker_does == "save"
    on_signal = ON_SIGNAL[worker_does].format(folder=tmp_path)
    worker = (
        f"import os, signal, sys, time; signal.signal({int(sig)}, {on_signal}); "
        f"open('{tmp_path}/started-' + os.environ['RANK'], 'w'); time.sleep(120)"
    )
    launcher = (  # SIGINT as in a foreground process: a background shell job inherits it ignored
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from primus.core.launch.launcher import Launch; from primus.core.launch.spawner import spawn; "
        f"sys.exit(spawn([sys.executable, '-c', {worker!r}], Launch(2), grace_s=3))"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    parent.send_signal(sig)
    expected = 75 if saving_s else 128 + int(sig)
    assert parent.wait(timeout=60) == expected
    assert sorted(p.name for p in tmp_path.glob("[0-9]")) == (["0", "1"] if saving_s else [])
    said = parent.communicate()[1]
    if not saving_s:  # the first worker to end is named, with how it ended
        how = "exited 1" if worker_does == "unsaved" else f"was killed by {sig.name}"
        assert re.search(rf"\[primus\] {sig.name}: rank [01] {how} without a checkpoint", said)


@pytest.mark.slow
def test_a_signal_the_spawner_passes_on_while_its_workers_start_waits_for_their_cli(
    tmp_path: Path,
) -> None:
    """The spawner starts Primus's CLI workers with the stop signals held: a SIGINT passed on
    while a worker's interpreter starts is noted once the CLI watches, not a traceback."""
    launcher = (
        "import sys; from primus.core.launch.launcher import Launch; "
        "from primus.core.launch.workers import launch_workers; "
        "from primus.core.reliability import preemption; preemption.watch(); "
        "sys.exit(launch_workers('spawn', ['--version'], Launch(2)))"
    )
    env = {**os.environ, **slow_worker_start(tmp_path)}
    parent = subprocess.Popen([sys.executable, "-c", launcher], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    workers = starting_workers(tmp_path, 2)
    parent.send_signal(signal.SIGINT)
    err = parent.communicate(timeout=60)[1]
    assert parent.returncode == 0, err[-3000:]  # each worker printed the versions and ended
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.count("SIGINT received during set-up: stopping before the first step") == 2
    assert left_alive(workers, timeout_s=5) == []


@pytest.mark.parametrize(
    ("code", "said"),
    [(3, "exited 3"), (-9, "was killed by SIGKILL"), (-40, "was killed by signal 40")],
)
def test_how_a_worker_ended_is_said_for_any_code(code: int, said: str) -> None:
    assert how_it_ended(code) == said  # signal 40: a real-time one, which has no name


def test_the_port_the_spawner_picks_is_held_for_the_workers(tmp_path: Path) -> None:
    """Another process cannot take the chosen MASTER_PORT (EADDRINUSE) while the workers run;
    a worker's server that shares the port (SO_REUSEPORT, as JAX's gRPC coordinator) binds it,
    listens, and is reached there."""
    worker = f"""
import os, socket
port = int(os.environ["MASTER_PORT"])
outsider = socket.socket()
try:
    outsider.bind(("0.0.0.0", port))
    verdict = "taken"
except OSError as e:
    verdict = f"refused {{e.errno}}"
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
server.bind(("127.0.0.1", port))
server.listen()
client = socket.create_connection(("127.0.0.1", port), timeout=5)
conn, _ = server.accept()
client.sendall(b"hi")
verdict += " " + conn.recv(2).decode()
open({str(tmp_path)!r} + "/verdict", "w").write(verdict)
"""
    assert spawn(python(worker), Launch(1)) == 0
    assert (tmp_path / "verdict").read_text() == "refused 98 hi"


def test_a_failed_worker_decides_the_code_whatever_torchrun_recorded_first() -> None:
    """torchrun's own failure records: the worker it stopped (exit 75) timed before the one
    that failed (the CI rehearsal's flake), then all stopped by a preemption signal, then one
    preempted rank (a signal to it alone) and another torchrun stopped with SIGTERM."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    def failure(rank: int, code: int, at: int) -> ProcessFailure:
        record = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="")
        record.timestamp = at
        return record

    assert failed_launch_code([failure(0, 75, 1), failure(1, 1, 2)]) == 1
    assert failed_launch_code([failure(0, 75, 1), failure(1, 2, 1)]) == 2
    assert failed_launch_code([failure(0, 75, 2), failure(1, 75, 1)]) == 75
    assert failed_launch_code([failure(0, -15, 1), failure(1, 75, 2)]) == 75
    assert failed_launch_code([failure(0, 75, 1), failure(1, -9, 2)]) == 1  # killed: a crash
    assert failed_launch_code([failure(0, -15, 1)]) == 1  # stopped, nothing saved


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="death signals are Linux's")
def test_torchrun_waits_for_the_workers_through_more_signals_and_ctrl_c_twice_aborts(
    tmp_path: Path,
) -> None:
    """Under torchrun, a second SIGTERM (Slurm signals the launcher, and uv passes it on again)
    does not cut short the wait for the workers' checkpoint; a second SIGINT aborts, and the
    workers die with the launcher."""
    worker = tmp_path.parent / f"{tmp_path.name}-worker.py"
    worker.write_text(
        "import os, time\n"
        "from primus.core.reliability import preemption\n"
        "from primus.core.launch.launcher import bind_worker_to_launcher\n"
        "bind_worker_to_launcher()\n"
        "preemption.watch()\n"
        f"open({str(tmp_path)!r} + '/' + str(os.getpid()), 'w').close()\n"
        "time.sleep(120)  # a checkpoint that takes its time\n"
    )
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import sys; from primus.core.launch.torchrun import run_torchrun; "
         "sys.exit(run_torchrun(['--nproc-per-node=2', '--master-port=0', "
         f"'--signals-to-handle=SIGTERM,SIGINT,SIGUSR1', {str(worker)!r}]))"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    pids = wait_for_files(tmp_path, 2)
    assert len(pids) == 2
    for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGUSR1):
        launcher.send_signal(sig)
        time.sleep(0.7)
    assert launcher.poll() is None and all(alive(pid) for pid in pids)
    launcher.send_signal(signal.SIGINT)
    assert launcher.wait(timeout=20) == -signal.SIGINT
    assert "SIGINT again: aborting without a checkpoint" in launcher.communicate()[1]
    assert left_alive(pids, timeout_s=5) == []
