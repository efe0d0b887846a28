"""The sbatch script `primus slurm` writes: what it asks Slurm for and how each node starts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from primus.core.launch.slurm import SlurmJob, render, time_limit_problem

RUN_DIR = Path("/nfs/runs/team/me/llama")
ARGS = ["--config", "/nfs/exp.yaml", "lr=1e-4", "--name", "two words"]


def script(**job: Any) -> str:
    fields = {"nodes": 4, "nproc_per_node": 8, "gpus_per_node": 8, "job_name": "primus-llama"}
    return render(SlurmJob(**(fields | job)), "pretrain", ARGS, RUN_DIR, "/venv/bin/python")


def directives(text: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")
    ]


def test_one_launcher_per_node_with_its_gpus_and_a_warning_before_the_time_limit() -> None:
    text = script(partition="gpu", account="proj", time="12:00:00", warn_s=600)
    assert directives(text) == [
        "--job-name=primus-llama",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--account=proj",
        "--time=12:00:00",
        f"--output={RUN_DIR}/logs/slurm-%j.out",
        "--open-mode=append",
        "--signal=USR1@600",
        "--exclusive",
        "--no-requeue",
    ]
    assert (
        'srun --kill-on-bad-exit=1 --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE"'
        in text
    )
    assert 'bash -c \'exec "$@" --node-rank="$SLURM_NODEID"\' primus' in text
    assert "/venv/bin/python -m primus.cli train pretrain --nnodes=4 --nproc-per-node=8" in text
    assert "--config /nfs/exp.yaml lr=1e-4 --name 'two words'" in text  # quoted for the shell
    assert "scontrol requeue" not in text


def test_cpu_runs_ask_for_no_gpus_and_cpus_instead_of_whole_nodes() -> None:
    lines = directives(script(gpus_per_node=0, cpus_per_node=16, sbatch_args=("--qos=high",)))
    assert not any(line.startswith("--gpus-per-node") for line in lines)
    assert "--cpus-per-task=16" in lines and "--exclusive" not in lines
    assert lines[-1] == "--qos=high"


def test_requeue_on_exit_75_unless_the_job_was_cancelled() -> None:
    text = script(requeue=True)
    assert "--requeue" in directives(text)
    assert f"[ -e {RUN_DIR}/preempted.json ]; then code=75; fi" in text
    assert 'if [ "$code" -eq 75 ] && [ -z "$terminated" ]; then' in text
    assert 'scontrol requeue "$SLURM_JOB_ID"' in text


def test_in_a_container_the_images_primus_runs() -> None:
    text = script(container_image="nvcr.io/me/primus:1", container_mounts="/shared:/shared")
    assert "--container-image=nvcr.io/me/primus:1 --container-mounts=/shared:/shared" in text
    assert "\n    primus train pretrain --nnodes=4" in text


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("requeue", [False, True])
def test_the_script_is_valid_bash(tmp_path: Path, requeue: bool) -> None:
    path = tmp_path / "job.sbatch"
    path.write_text(script(requeue=requeue, container_image="img"))
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def sbatch_reads(line: str) -> list[str]:
    """The arguments sbatch takes from an #SBATCH line (its `_get_argument`, src/sbatch/opt.c):
    quotes group, a backslash escapes the next character, an unquoted `#` ends the line."""
    found, argument, quote, escaped, started = [], "", "", False, False
    for char in line + " ":
        if escaped:
            argument, escaped, started = argument + char, False, True
        elif char == "\\":
            escaped = True
        elif quote:
            quote, argument = ("", argument) if char == quote else (quote, argument + char)
        elif char in "\"'":
            quote, started = char, True
        elif char == "#" or char.isspace():
            if started:
                found.append(argument)
            argument, started = "", False
            if char == "#":
                break
        else:
            argument, started = argument + char, True
    return found


def test_names_and_paths_with_spaces_quotes_and_percent_reach_sbatch_whole() -> None:
    """A workspace or experiment name with a space, a quote, a `#` or a backslash is one
    argument to sbatch; a `%` in the run directory is doubled (sbatch expands `%j` there)."""
    odd = 'a b"c#d\\e'
    text = render(SlurmJob(nodes=1, nproc_per_node=1, gpus_per_node=1, job_name=f"primus-{odd}"),
                  "pretrain", ARGS, Path(f"/nfs/{odd} 50%"), "/venv/bin/python")  # fmt: skip
    lines = directives(text)
    read = [sbatch_reads(line) for line in lines]
    assert [f"--job-name=primus-{odd}"] in read
    assert [f"--output=/nfs/{odd} 50%%/logs/slurm-%j.out"] in read
    assert all(len(arguments) == 1 for arguments in read), read


def test_the_value_of_an_extra_sbatch_option_reaches_sbatch_whole() -> None:
    """`--sbatch='--comment=run #1'` was cut at the `#`; a space-separated value stays apart."""
    text = script(sbatch_args=("--comment=run #1", '--mail-user=a"b', "-q high", "--qos=x"))
    read = [sbatch_reads(line) for line in directives(text)]
    assert read[-4:] == [["--comment=run #1"], ['--mail-user=a"b'], ["-q", "high"], ["--qos=x"]]


@pytest.mark.parametrize(
    ("limit", "why"),
    [
        ("90", None), ("90:30", None), ("48:00:00", None), ("2-12", None), ("2-12:30", None),
        ("1-23:59:59", None), ("UNLIMITED", None), ("infinite", None),
        ("90:60", ": 60 seconds (at most 59)"), ("1:60:00", ": 60 minutes (at most 59)"),
        ("1-24", ": 24 hours (at most 23)"), ("1-0:0:60", ": 60 seconds (at most 59)"),
        ("1:2:3:4", ""), ("two hours", ""), ("-5", ""), ("1- 2", ""),
    ],
)  # fmt: skip
def test_time_limits_as_sbatch_reads_them(limit: str, why: str | None) -> None:
    """The leading unit is unbounded (90 minutes, 48 hours); those after it are not."""
    expected = None if why is None else f"{limit!r} is not a Slurm time limit{why}"
    assert time_limit_problem(limit) == expected
