"""Slurm batch scripts for `primus slurm`: one Primus launcher per node, started through `srun`.

Each node's launcher (torchrun, or Primus's spawner) starts the node's workers; node 0's address
(its Slurm NodeAddr) and a port derived from the job id are the rendezvous. Slurm's warning
before the time limit (`--signal=USR1@s`, sent to every process of the job's steps) and the
SIGTERM of a preemption reach the launchers and the workers, which save a checkpoint at the next
step and exit 75; with `requeue`, the script then requeues the job, which resumes from it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from primus.core.errors import ConfigError, PrimusError
from primus.core.reliability.preemption import EXIT_PREEMPTED, MARKER

PORT_BASE = 20000  # MASTER_PORT = PORT_BASE + job id % PORT_SPAN: same on every node, no probe
PORT_SPAN = 20000


@dataclass(frozen=True)
class SlurmJob:
    """What the batch script asks Slurm for, and how each node starts its workers."""

    nodes: int
    nproc_per_node: int
    gpus_per_node: int
    job_name: str
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    cpus_per_node: int | None = None  # None: whole nodes (--exclusive)
    container_image: str | None = None
    container_mounts: str | None = None
    requeue: bool = False
    warn_s: int = 300  # Slurm's USR1 this many seconds before the time limit
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)


def _sbatch_value(value: object) -> str:
    """`value` as sbatch reads it on an #SBATCH line: it splits at spaces and ends at a `#`
    outside quotes, and a backslash escapes the next character."""
    text = str(value)
    if not any(c.isspace() or c in "\"'\\#" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


TIME_FORMATS = "minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or UNLIMITED"
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", re.ASCII)


def time_limit_problem(text: str) -> str | None:
    """Why `text` is no time limit sbatch takes (`--time`; TIME_FORMATS), or None. The leading
    unit is unbounded; after it, minutes and seconds stay below 60, and hours below 24."""
    if text.lower() in ("infinite", "unlimited"):
        return None
    match = _TIME.fullmatch(text)
    if match is None:
        return f"{text!r} is not a Slurm time limit"
    days, *rest = match.groups()
    parts = [int(p) for p in rest if p is not None]
    if days:  # D-H[:M[:S]]
        units, bounded = ("hours", "minutes", "seconds")[: len(parts)], parts
    else:  # M, M:S, H:M:S: the leading unit unbounded
        units, bounded = ("minutes", "seconds")[3 - len(parts) :], parts[1:]
    for unit, value in zip(units, bounded, strict=True):
        limit = 24 if unit == "hours" else 60
        if value >= limit:
            return f"{text!r} is not a Slurm time limit: {value} {unit} (at most {limit - 1})"
    return None


def name_problem(text: str) -> str | None:
    """Why `text` is no Slurm name (a partition, an account, a QOS; several, comma-separated),
    or None: letters, digits and `_.-+`, which no shell and no #SBATCH line splits."""
    if re.fullmatch(r"[\w.+-]+(,[\w.+-]+)*", text, re.ASCII):
        return None
    odd = [c for c in text if not (c.isascii() and (c.isalnum() or c in "_.+-,"))]
    return f"{text!r} is not a Slurm name" + (f": it holds {odd[0]!r}" if odd else "")


# sbatch's short options for those the script may set -> their long names
SHORT = {"N": "nodes", "c": "cpus-per-task", "p": "partition", "A": "account", "t": "time",
         "J": "job-name", "o": "output"}  # fmt: skip
# what sets an option of the script instead of --sbatch
INSTEAD = {"nodes": "--nnodes", "ntasks-per-node": "--nproc-per-node",
           "gpus-per-node": "--gpus-per-node", "cpus-per-task": "--cpus-per-node",
           "partition": "--partition", "account": "--account", "time": "--time",
           "signal": "--warn", "requeue": "--requeue", "no-requeue": "--requeue",
           "exclusive": "--cpus-per-node", "job-name": "the experiment's exp_name",
           "output": "the run directory's logs/", "open-mode": "the run directory's logs/"}  # fmt: skip


def sbatch_conflict(option: str, job: SlurmJob) -> str | None:
    """Why an extra sbatch option (`--qos=high`, `-N 2`) may not be given, or None: the script
    writes it already for `job`, and sbatch would take the later of the two."""
    long = option.startswith("--")
    name = option.lstrip("-").split("=", 1)[0].split(" ", 1)[0]
    name = name if long else SHORT.get(name[:1], name[:1])
    own = _directives(replace(job, sbatch_args=()), Path())
    written = {line.split()[1].lstrip("-").split("=", 1)[0] for line in own}
    if name not in written:
        return None
    return f"the script sets {name} itself: use {INSTEAD.get(name, 'its own option')}"


def _directives(job: SlurmJob, log: Path) -> list[str]:
    options = {
        "job-name": job.job_name,
        "nodes": job.nodes,
        "ntasks-per-node": 1,  # one Primus launcher per node; it starts the node's workers
        "gpus-per-node": job.gpus_per_node or None,
        "cpus-per-task": job.cpus_per_node,
        "partition": job.partition,
        "account": job.account,
        "time": job.time,
        "output": log,
        "open-mode": "append",  # a requeued job adds to its log
        "signal": f"USR1@{job.warn_s}",
    }
    lines = [f"--{k}={_sbatch_value(v)}" for k, v in options.items() if v is not None]
    lines += ["--exclusive"] if job.cpus_per_node is None else []
    lines += ["--requeue" if job.requeue else "--no-requeue", *map(_extra, job.sbatch_args)]
    return [f"#SBATCH {line}" for line in lines]


def _extra(option: str) -> str:
    """An extra sbatch option as given (`-t 10`, `--qos high`); the value of `--name=value`
    whole (`--comment=run #1` was cut at the `#`)."""
    name, eq, value = option.partition("=")
    return f"{name}={_sbatch_value(value)}" if option.startswith("--") and eq else option


def render(job: SlurmJob, stage: str, train_args: list[str], run_dir: Path, python: str) -> str:
    """The batch script that runs `primus train <stage> <train_args>` on `job.nodes` nodes;
    `python` runs Primus (`primus` itself inside a container)."""
    log = Path(str(run_dir).replace("%", "%%")) / "logs" / "slurm-%j.out"  # %j: the job id
    marker = shlex.quote(str(run_dir / MARKER))
    command = [
        *([python, "-m", "primus.cli"] if job.container_image is None else ["primus"]),
        "train",
        stage,
        f"--nnodes={job.nodes}",
        f"--nproc-per-node={job.nproc_per_node}",
    ]
    srun = ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1"]
    srun += ['--cpus-per-task="$SLURM_CPUS_ON_NODE"']  # srun would give its task 1 CPU
    if job.container_image is not None:
        srun += [f"--container-image={shlex.quote(job.container_image)}"]
        if job.container_mounts:
            srun += [f"--container-mounts={shlex.quote(job.container_mounts)}"]
    requeue = (
        f"""
# Preempted with a checkpoint and not cancelled: requeue; the new run resumes from it. (After a
# SIGTERM, which `scancel` and Slurm's preemption send this shell too, Slurm decides.)
if [ "$code" -eq {EXIT_PREEMPTED} ] && [ -z "$terminated" ]; then
    echo "[primus] preempted: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
fi"""
        if job.requeue
        else ""
    )
    return f"""#!/bin/bash
# Written by `primus slurm`: one Primus launcher per node (srun, one task each), which starts
# {job.nproc_per_node} worker(s) there. Submit it again with: sbatch <this file>
{chr(10).join(_directives(job, log))}

set -uo pipefail
# The rendezvous: node 0's address as Slurm knows it, and a port derived from the job id.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export MASTER_ADDR=${{MASTER_ADDR:-$head_node}}  # where node details are private: its name
export MASTER_PORT=$(({PORT_BASE} + SLURM_JOB_ID % {PORT_SPAN}))
echo "[primus] job $SLURM_JOB_ID on $SLURM_JOB_NODELIST; rendezvous $MASTER_ADDR:$MASTER_PORT"

# Slurm's USR1 (the time limit nears) and SIGTERM (preemption) reach every process of the step:
# the workers save a checkpoint at the next step and exit {EXIT_PREEMPTED}. This shell waits for them.
terminated=
trap 'terminated=1; echo "[primus] SIGTERM: waiting for the workers to save and stop"' TERM
rm -f {marker}
{" ".join(srun)} \\
    bash -c 'exec "$@" --node-rank="$SLURM_NODEID"' primus \\
    {shlex.join(command)} \\
    --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \\
    {shlex.join(train_args)}
code=$?
if [ "$code" -ne 0 ] && [ -e {marker} ]; then code={EXIT_PREEMPTED}; fi{requeue}
exit "$code"
"""


def submit(script: Path) -> str:
    """`sbatch script`; the job id."""
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError(
            "sbatch not found: this host cannot submit Slurm jobs",
            hint="run on a Slurm login node, or print the script with --dry-run",
        )
    done = subprocess.run(
        [sbatch, "--parsable", str(script)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise PrimusError(f"sbatch refused {script}: {done.stderr.strip()}")
    match = re.match(r"\d+", done.stdout.strip())
    if match is None:
        raise PrimusError(f"sbatch printed no job id: {done.stdout.strip()!r}")
    return match.group()
