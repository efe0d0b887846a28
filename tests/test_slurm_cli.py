"""`primus slurm` as users meet it, without a cluster: --dry-run, --help, and the errors (exit 2,
one message, no traceback). Submitting is tested against a real Slurm in test_multinode.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing.runs import primus

pytestmark = pytest.mark.slow

DUMMY_QUICKSTART = Path(__file__).parent / "fixtures" / "dummy-quickstart.yaml"


def slurm(tmp_path: Path, *args: str, **env: str):
    return primus(
        "slurm", "pretrain", "--config", str(DUMMY_QUICKSTART), f"workspace={tmp_path}", *args,
        **env,
    )  # fmt: skip


def test_dry_run_prints_the_script_and_writes_nothing(tmp_path: Path) -> None:
    result = slurm(tmp_path, "--nnodes", "2", "--nproc-per-node", "4", "-p", "gpu", "--dry-run",
                   "train_iters=7")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\n" in (
        result.stdout
    )
    assert "#SBATCH --job-name=primus-quickstart" in result.stdout
    assert f"workspace={tmp_path} train_iters=7" in result.stdout
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--time", "two hours"), "'two hours' is not a Slurm time limit"),
        (("--nnodes", "0"), "Invalid value for '--nnodes'"),
        (("--sbatch", "qos=high"), "'qos=high' is not an option"),
        (("train_itres=5",), "train_itres"),
        (("--container-mounts", "/data:/data"), "name its --container-image"),
        (("--container-image", "img", "--container-mounts", "/data"), "'/data' is not SRC:DST"),
    ],
    ids=["time", "nnodes", "sbatch", "config", "mounts-without-image", "mount-without-target"],
)
def test_bad_flags_and_config_are_exit_2_with_one_message(
    tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    result = slurm(tmp_path, *args, COLUMNS="300")  # typer's error box unwrapped
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "local").exists()


def test_without_sbatch_it_says_so(tmp_path: Path) -> None:
    result = slurm(tmp_path, PATH=str(tmp_path))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "sbatch not found" in result.stderr and "--dry-run" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_explains_the_job() -> None:
    result = primus("slurm", "pretrain", "--help", COLUMNS="200")
    assert result.returncode == 0
    for words in ("sbatch", "--requeue", "SIGUSR1", "--gpus-per-node", "shared filesystem"):
        assert words in result.stdout, words


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--sbatch=--nodes=5",), "'--nodes=5': the script sets nodes itself: use --nnodes"),
        (("--sbatch=-N3",), "'-N3': the script sets nodes itself: use --nnodes"),
        (("--time", "1:00:00", "--sbatch=-t 10"), "the script sets time itself: use --time"),
        (("--sbatch=--exclusive",), "the script sets exclusive itself: use --cpus-per-node"),
        (("--partition", ""), "error: --partition is empty"),
        (("--account", " "), "error: --account is empty"),
        (("--partition", "gpu\nhostname"), "--partition: 'gpu\\nhostname' holds a control"),
        (("--sbatch=--qos=a\nhostname",), "--sbatch: '--qos=a\\nhostname' holds a control"),
        (("--partition", "a b"), "--partition: 'a b' is not a Slurm name: it holds ' '"),
        (("-A", "me;hostname"), "--account: 'me;hostname' is not a Slurm name: it holds ';'"),
        (("--time", "1:99:99"), "'1:99:99' is not a Slurm time limit: 99 minutes (at most 59)"),
        (("--time", "1-24"), "'1-24' is not a Slurm time limit: 24 hours (at most 23)"),
        (("--sbatch=--",), "--sbatch: '--' is not an option"),
    ],
)
def test_options_the_script_sets_itself_or_empty_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], message: str
) -> None:
    """In process: a second `#SBATCH --nodes` overrode the first while the launchers still
    expected --nnodes; an empty --partition wrote `#SBATCH --partition=`; a newline in one ended
    its #SBATCH line, the rest a command of the script."""
    from primus.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["slurm", "pretrain", "--config", str(DUMMY_QUICKSTART), "--dry-run", *args,
              f"workspace={tmp_path}"])  # fmt: skip
    assert done.value.code == 2
    assert message in " ".join(capsys.readouterr().err.replace("│", " ").split())


def test_an_option_the_script_leaves_out_may_be_given(tmp_path: Path, capsys) -> None:
    """--partition unset: the script writes none, so --sbatch=-p gpu is the only one."""
    from primus.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(["slurm", "pretrain", "--config", str(DUMMY_QUICKSTART), "--dry-run",
              "--sbatch=--partition=gpu", f"workspace={tmp_path}"])  # fmt: skip
    assert done.value.code == 0
    assert capsys.readouterr().out.count("#SBATCH --partition") == 1
