"""A real Slurm on this host for tests: munged, slurmctld and two slurmd ("nodes" n1 and n2,
both 127.0.0.1), all from files under one directory (Debian's slurm-wlm; run as root).

    with local_cluster(tmp_path) as env:   # SLURM_CONF for sbatch, squeue, scontrol
        job = submit(...); wait_for(job, env)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")
NODES = ("n1", "n2")


def missing() -> str | None:
    """Why no cluster can start here, or None."""
    if os.geteuid() != 0:
        return "slurmd runs as root: run as root"
    absent = [d for d in DAEMONS if shutil.which(d) is None]
    if absent:
        return f"{', '.join(absent)} not installed (apt-get install slurm-wlm; .ci/run does)"
    return None


def _ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for sock in socks:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in socks]
    for sock in socks:
        sock.close()
    return ports


def _conf(root: Path, host: str, ports: list[int]) -> str:
    ctld, slurmd, *node_ports = ports
    nodes = "\n".join(
        f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs=4 State=UNKNOWN"
        for n, p in zip(NODES, node_ports, strict=True)
    )
    return f"""ClusterName=primustest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


def _squeue(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(["squeue", "-h", *args], env=env, capture_output=True, text=True)
    return done.stdout.strip()


def _logs(root: Path) -> str:
    return "\n".join(
        f"--- {log.name}\n{log.read_text()[-2000:]}" for log in sorted(root.glob("*.log"))
    )


@contextmanager
def local_cluster(root: Path, timeout_s: float = 30) -> Iterator[dict[str, str]]:
    """Start the daemons (as children of this process) and wait until both nodes are idle;
    yield the environment for Slurm's commands. Cancels every job and stops every daemon on
    the way out, also on failure."""
    for name in ("state", "spool/n1", "spool/n2"):
        (root / name).mkdir(parents=True)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    conf.write_text(_conf(root, socket.gethostname().split(".")[0], _ports(4)))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    munged = [
        "munged", "--foreground", "--force", f"--key-file={key}",
        f"--socket={root}/munge.socket", f"--pid-file={root}/munged.pid",
        f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed",
    ]  # fmt: skip
    commands = [
        munged,
        ["slurmctld", "-D", "-i", "-f", str(conf)],
        *(["slurmd", "-D", "-f", str(conf), "-N", node] for node in NODES),
    ]
    with ExitStack() as stack:
        for command in commands:
            daemon = subprocess.Popen(
                command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
            )
            stack.callback(_stop, daemon)
            time.sleep(0.5)  # munged's socket before slurmctld, slurmctld before slurmd
        stack.callback(_cancel_all, env)
        deadline = time.monotonic() + timeout_s
        while True:
            states = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True
            ).stdout.split()
            if states == ["idle"] * len(NODES):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"Slurm nodes not idle after {timeout_s} s: {states}\n{_logs(root)}"
                )
            time.sleep(0.5)
        yield env


def _stop(daemon: subprocess.Popen[bytes]) -> None:
    daemon.terminate()
    try:
        daemon.wait(10)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait()


def _cancel_all(env: dict[str, str], timeout_s: float = 30) -> None:
    """Cancel every job; wait until none is left, so no job step outlives its slurmd."""
    subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
    deadline = time.monotonic() + timeout_s
    while _squeue(env) and time.monotonic() < deadline:
        time.sleep(0.5)


def wait_for(job: str, env: dict[str, str], timeout_s: float = 300) -> None:
    """Wait until job `job` has left the queue (it ended, however)."""
    deadline = time.monotonic() + timeout_s
    while _squeue(env, "-j", job) and time.monotonic() < deadline:
        time.sleep(1)
    if _squeue(env, "-j", job):
        raise TimeoutError(f"Slurm job {job} still queued after {timeout_s} s")


def exit_code(job: str, env: dict[str, str]) -> int:
    """The exit code of job `job`'s batch script, while slurmctld still remembers the job."""
    shown = subprocess.run(
        ["scontrol", "show", "job", job], env=env, capture_output=True, text=True
    ).stdout
    return int(shown.split("ExitCode=", 1)[1].split(":", 1)[0])
