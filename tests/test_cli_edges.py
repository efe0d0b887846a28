"""The CLI's handling of what is around a command: an option given twice, an error with no line
to point at, an exception typer would misread, a launch without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

DUMMY_QUICKSTART = Path(__file__).parent / "fixtures" / "dummy-quickstart.yaml"


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "pretrain", "--config", "a.yaml", "-c", "b.yaml", "--dry-run"],
        ["config", "validate", "-c", "a.yaml", "--config=b.yaml"],
        ["config", "show", "--config", "a.yaml", "--config", "a.yaml"],
    ],
)
def test_config_given_twice_is_refused_before_anything_is_read(argv, capsys) -> None:
    """In process: typer would keep the last --config and drop the other without a word."""
    from primus.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err == (
        "error: --config is given 2 times: give the experiment YAML once\n"
        "  hint: keep one --config (overrides after it change its values)\n"
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["train", "pretrain", "-c", ""], "-c is empty: name the experiment YAML"),
        (["config", "validate", "--config= "], "--config is empty: name the experiment YAML"),
        (["checkpoint", "inspect", ""], "an empty argument after 'checkpoint inspect'"),
        (["preflight", "--workspace", " "], "--workspace is empty"),
        (["checkpoint", "preset", "--hf="], "--hf is empty"),
        (["config", "validate", "exp.yaml", "--stage", ""], "--stage is empty"),
    ],
)
def test_an_empty_argument_is_refused_not_read_as_the_current_folder(argv, said, capsys) -> None:
    from primus.cli.main import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {said}\n")


def test_an_error_without_a_line_names_its_module_in_a_several_module_experiment(
    tmp_path,
) -> None:
    """In process: Megatron's missing num_layers has no line to point at; the module does."""
    from primus.testing.fuzz_runs import run_in_process

    recipe = Path(__file__).resolve().parents[1] / "configs" / "megatron" / "tiny-cpu.yaml"
    argv = ["config", "validate", str(recipe), "modules.new.framework=megatron"]
    done = run_in_process(argv, tmp_path, {"PRIMUS_WORKSPACE": str(tmp_path / "ws")})
    assert done.code == 2, done.stderr
    assert "error: module 'new': num_layers is not set" in done.stderr


def test_an_eof_error_in_a_run_is_raised_with_its_traceback(tmp_path, monkeypatch) -> None:
    """In process: typer would take an EOFError (a helper's pipe that closed) for the end of
    input, print "Aborted." and drop it; the run's failure keeps it as its cause."""
    import primus.backends.dummy.dummy_pretrain_trainer as dummy
    from primus.cli.main import main
    from primus.testing.in_process import in_process

    def closed(self: object) -> None:
        raise EOFError("the helper's pipe")

    monkeypatch.setattr(dummy.DummyPretrainTrainer, "train", closed)
    with in_process(), pytest.raises(RuntimeError, match="the command ended on EOFError") as err:
        main(["train", "pretrain", "--config", str(DUMMY_QUICKSTART), f"workspace={tmp_path}"])
    assert isinstance(err.value.__cause__, EOFError)


def test_launching_workers_without_torch_says_how_to_get_it(tmp_path) -> None:
    blocked = textwrap.dedent(f"""
        import importlib.abc, sys
        class NoTorch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] == "torch":
                    raise ImportError("No module named 'torch'")
        sys.meta_path.insert(0, NoTorch())
        from primus.cli.main import main
        main(["train", "pretrain", "--config", {str(DUMMY_QUICKSTART)!r}, "--nproc-per-node", "2"])
    """)
    result = subprocess.run(
        [sys.executable, "-c", blocked],
        capture_output=True,
        text=True,
        env={**os.environ, "PRIMUS_WORKSPACE": str(tmp_path)},
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        "needs PyTorch, which is not installed" in result.stderr
        and "pip install torch" in result.stderr
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "pretrain", "--config", str(DUMMY_QUICKSTART), "--dry-run", "--node-rank", "3"],
        ["preflight", "--node-rank", "1"],
        ["benchmark", "collectives", "--node-rank", "2"],
        ["preflight", "--nodes-ok", "ok.txt"],
    ],
)
def test_launch_flags_that_contradict_are_refused_on_one_node_too(argv, capsys) -> None:
    """In process: a node rank past --nnodes (1 by default) was ignored without a word unless
    the command launched several processes; --nodes-ok without --node-smoke likewise."""
    from primus.cli.main import main
    from primus.testing.in_process import in_process

    with in_process(), pytest.raises(SystemExit) as done:
        main(argv)
    said = " ".join(capsys.readouterr().err.replace("│", " ").split())
    assert done.value.code == 2
    assert "is not below --nnodes 1" in said or "is a node list of --node-smoke" in said


def test_a_stop_signal_while_the_launcher_loads_starts_no_worker(
    tmp_path, monkeypatch, capsys
) -> None:
    """In process, the signal raised from within the load: Ctrl-C during the seconds torchrun's
    import takes started the workers anyway, and they stopped only once built (30 s here)."""
    import signal

    from primus.cli.main import main
    from primus.core.launch import workers
    from primus.core.reliability import preemption
    from primus.testing.in_process import in_process

    started: list[object] = []
    monkeypatch.setattr(workers, "load_launcher", lambda _: signal.raise_signal(signal.SIGTERM))
    monkeypatch.setattr(workers, "launch_workers", lambda *args: started.append(args) or 0)
    with in_process(), pytest.raises(SystemExit) as done:
        main(["train", "pretrain", "--config", str(DUMMY_QUICKSTART), "--nproc-per-node", "2",
              f"workspace={tmp_path}"])  # fmt: skip
    assert done.value.code == preemption.EXIT_PREEMPTED and started == []
    assert "preempted by SIGTERM before the workers started" in capsys.readouterr().err
    # nothing left for later tests: the processes they start would count as signalled
    assert preemption.requested() is None and preemption.ENV not in os.environ


def test_an_override_given_twice_is_told_and_the_last_one_is_used(tmp_path) -> None:
    """In process: `config validate` and the run's log both say which value a repeated key took."""
    from primus.testing.fuzz_runs import run_in_process
    from primus.testing.in_process import in_process

    given = ["train_iters=7", "--train-iters", "3"]
    note = "train_iters is given 2 times on the command line ('train_iters=7', '--train-iters 3')"
    for command in (["config", "validate"], ["train", "pretrain", "--config"]):
        with in_process():
            done = run_in_process([*command, str(DUMMY_QUICKSTART), *given], tmp_path, {})
        assert done.code == 0, done.stderr
        assert f"{note}: the last one is used" in done.stderr
    summary = tmp_path / "ws" / "local" / "local" / "quickstart" / "summary.json"
    assert json.loads(summary.read_text())["steps"] == 3


def test_a_pasted_blob_as_an_override_key_is_quoted_short(tmp_path) -> None:
    """In process: a 100,000-character key was echoed whole, twice, in its one error line."""
    from primus.core.errors import DETAIL_WIDTH
    from primus.testing.fuzz_runs import run_in_process

    argv = ["config", "validate", str(DUMMY_QUICKSTART), "k" * 100_000 + "=1"]
    done = run_in_process(argv, tmp_path, {})
    origin, key = "k" * DETAIL_WIDTH + "...", "k" * 60 + "..."  # an origin is clipped later
    assert (done.code, done.stderr) == (
        2, f"error: cli ({origin}): unknown parameter '{key}'\n"
    )  # fmt: skip


def test_a_section_given_a_value_is_told_to_be_a_mapping(tmp_path) -> None:
    """In process: `patches=5` (or TorchTitan's `training=5`) was an unknown key 'patches'."""
    from primus.testing.fuzz_runs import run_in_process

    done = run_in_process(["config", "validate", str(DUMMY_QUICKSTART), "patches=5"], tmp_path, {})
    assert (done.code, done.stderr) == (2, "error: cli (patches=5): patches: must be a mapping "
                                        "(of patches.select, patches.on_error), got int 5\n")  # fmt: skip


@pytest.mark.parametrize("addr", ["-h", "--help", "h-1", "::1", "[fe80::1%eth0]"])
def test_a_master_address_that_reads_as_an_option_is_refused(addr: str) -> None:
    """`--master-addr -h` was taken, and handed to the launcher as an option."""
    import typer

    from primus.cli.common import checked_launch

    if addr.startswith("-"):
        with pytest.raises(typer.BadParameter, match="is not a host name or an IP address"):
            checked_launch(1, 1, 0, addr, None)
    else:
        assert checked_launch(1, 1, 0, addr, None).master_addr == addr
