"""The `primus` command end to end, as real subprocesses, with the dummy plugin installed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from primus.core.backend.capabilities import CAPABILITIES
from primus.testing.runs import primus

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[1]
DUMMY_QUICKSTART = ROOT / "tests" / "fixtures" / "dummy-quickstart.yaml"


def train_quickstart(workspace: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`primus train pretrain --config <the dummy quickstart> ARGS` writing under `workspace`."""
    return primus(
        "train", "pretrain", "--config", str(DUMMY_QUICKSTART), f"workspace={workspace}", *args,
        **env,
    )  # fmt: skip


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_help_and_core_import_no_framework() -> None:
    probe = textwrap.dedent("""
        import sys
        import primus.core, primus.core.config, primus.core.patches, primus.core.runtime
        import primus.core.backend.backend_registry, primus.testing.conformance
        import primus.testing.patches.megatron  # test-only patches: no megatron, no torch
        from primus.cli.main import main
        try:
            main(["--help"])
        except SystemExit as exc:
            assert exc.code == 0
        heavy = {"torch", "jax", "dummytrain", "numpy", "triton"} & {m.split(".")[0] for m in sys.modules}
        heavy |= {m for m in sys.modules if m.startswith("primus.backends")}
        print("HEAVY", sorted(heavy))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "train" in out.stdout and "HEAVY []" in out.stdout


GOOD = """
    workspace: {ws}
    modules:
      pre_trainer:
        framework: dummy
        config: dummy_trainer.yaml
        model: dummy_tiny.yaml
        overrides:
          train_iters: 5
"""


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, r"error: config file not found: .*nope.yaml"),
        ({"exp.yaml": "modules:\n  m: [1, 2\n"}, r"error: exp.yaml:2: YAML syntax error"),
        (
            {"exp.yaml": "extends: b.yaml\n", "b.yaml": "extends: exp.yaml\n"},
            r"error: b.yaml:1: extends cycle: exp.yaml -> b.yaml -> exp.yaml",
        ),
        (
            {"exp.yaml": "exp_name: ${PRIMUS_NOT_SET_ANYWHERE}\n"},
            r"error: exp.yaml:1: environment variable PRIMUS_NOT_SET_ANYWHERE is not set",
        ),
        (
            {"exp.yaml": GOOD.replace("model:", "modle:")},
            r"error: exp.yaml:6: unknown module key 'modle' \(did you mean: model\?\)",
        ),
        (
            {"exp.yaml": GOOD.replace("train_iters: 5", "train_itres: 5")},
            r"error: exp.yaml:8: unknown parameter 'train_itres' \(did you mean: train_iters\?\)",
        ),
        (
            {"exp.yaml": GOOD.replace("train_iters: 5", "lr: fast")},
            r"error: exp.yaml:8: lr: must be a number, got str 'fast'",
        ),
        (
            {"exp.yaml": GOOD.replace("framework: dummy", "framework: dumy")},
            r"error: exp.yaml:4: unknown framework 'dumy' \(did you mean: dummy\?\)\n  hint: installed backends: dummy",
        ),
    ],
)
def test_config_errors_are_one_message_with_file_line_and_exit_2(tmp_path, files, message) -> None:
    for name, text in files.items():
        write(tmp_path, name, text.replace("{ws}", str(tmp_path / "ws")))
    exp = "exp.yaml" if files else "nope.yaml"
    for command in (["config", "validate", exp], ["train", "pretrain", "--config", exp]):
        result = primus(*command, cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert re.search(message, result.stderr), result.stderr
        assert "Traceback" not in result.stderr
    debug = primus("train", "pretrain", "--config", exp, "--debug", cwd=tmp_path)
    assert debug.returncode == 2 and "Traceback" in debug.stderr


def test_cli_override_errors_point_at_the_command_line(tmp_path) -> None:
    exp = write(tmp_path, "exp.yaml", GOOD.format(ws=tmp_path / "ws"))
    result = primus("train", "pretrain", "--config", str(exp), "--lr", "[1]", "--seeed", "3")
    assert result.returncode == 2
    assert "2 config errors:" in result.stderr
    assert "cli (--lr [1]): lr: must be a number, got list [1]" in result.stderr
    assert "cli (--seeed 3): unknown parameter 'seeed' (did you mean: seed?)" in result.stderr


def test_config_show_and_validate(tmp_path) -> None:
    shown = primus("config", "show", str(DUMMY_QUICKSTART), "--provenance", "--lr", "1e-3")
    assert shown.returncode == 0, shown.stderr
    assert re.search(
        r"lr: 0.001  # cli \(--lr 1e-3\) \(overrode 0.05 from .*dummy_trainer.yaml:4\)",
        shown.stdout,
    )
    as_json = json.loads(primus("config", "show", str(DUMMY_QUICKSTART), "--format", "json").stdout)
    assert as_json["modules"]["pre_trainer"]["overrides"]["train_iters"] == 200
    valid = primus("config", "validate", str(DUMMY_QUICKSTART))
    assert valid.returncode == 0 and "valid" in valid.stdout
    as_in_train = primus("config", "validate", "--config", str(DUMMY_QUICKSTART))
    assert as_in_train.returncode == 0 and as_in_train.stdout == valid.stdout
    twice = primus("config", "validate", str(DUMMY_QUICKSTART), "-c", str(DUMMY_QUICKSTART))
    assert twice.returncode == 2 and "give the experiment YAML once" in twice.stderr


def test_dry_run_prints_args_and_plan(tmp_path) -> None:
    fast = train_quickstart(tmp_path, "--dry-run")
    assert fast.returncode == 0, fast.stderr
    assert "# backend args: not built (--full builds them" in fast.stdout
    assert re.search(r"build_args\s+dummy.checkpoint_dir\s+applies if ", fast.stdout)
    assert "lifecycle: convert_config" not in fast.stderr
    alone = train_quickstart(tmp_path, "--full")  # a run: --full means nothing there
    assert alone.returncode == 2 and "give it with --dry-run" in alone.stderr, alone.stderr
    # an option misspelt would otherwise be an override the backend does not know (or train)
    misspelt = train_quickstart(tmp_path, "--dry_run", "--nproc-per-node=1")
    assert misspelt.returncode == 2, misspelt.stderr
    assert "no such option: --dry_run (did you mean --dry-run?)" in misspelt.stderr
    result = train_quickstart(tmp_path, "--dry-run", "--full")
    assert result.returncode == 0, result.stderr
    assert "# backend args (TrainConfig)" in result.stdout and "train_iters: 200" in result.stdout
    assert re.search(r"build_args\s+dummy.checkpoint_dir\s+applied", result.stdout)
    assert re.search(r"before_train\s+dummy.finite_loss\s+will apply", result.stdout)
    assert list(tmp_path.iterdir()) == []


def losses(log: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss (\d+\.\d+)", log)]


def test_quickstart_trains_and_fills_the_run_directory(tmp_path) -> None:
    result = train_quickstart(tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "local" / "local" / "quickstart"
    curve = losses((run_dir / "logs" / "rank-0.log").read_text())
    assert len(curve) == 10 and curve[-1] < curve[0] / 100
    assert "samples/s" in result.stderr
    assert (run_dir / "checkpoints" / "checkpoint.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 200 and summary["last_loss"] < summary["first_loss"]
    assert "# resolved by primus" in (run_dir / "config.resolved.yaml").read_text()


def test_a_crash_in_training_cleans_up_and_exits_1(tmp_path) -> None:
    result = train_quickstart(tmp_path, "lr=100")
    assert result.returncode == 1
    assert re.search(r"(FloatingPointError: non-finite loss|OverflowError)", result.stderr)
    log = (tmp_path / "local/local/quickstart/logs/rank-0.log").read_text()
    assert "trainer.cleanup(on_error=True)" in log
    report = json.loads((tmp_path / "local/local/quickstart/patch_report.json").read_text())
    assert {p["id"]: p["status"] for p in report["patches"]}["dummy.summary"] == "not run"


def test_patch_selection_from_the_environment(tmp_path) -> None:
    result = train_quickstart(tmp_path, "train_iters=3", PRIMUS_PATCHES="-dummy.summary")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "local/local/quickstart/patch_report.json").read_text())
    assert report["selection"] == "PRIMUS_PATCHES"
    assert not (tmp_path / "local/local/quickstart/summary.json").exists()
    typo = train_quickstart(tmp_path, PRIMUS_PATCHES="dummy.sumary")
    assert typo.returncode == 2 and "did you mean: dummy.summary" in typo.stderr


def test_two_workers_through_torchrun(tmp_path) -> None:
    """... and torchrun's log folder goes with the launch (TMPDIR short: sockets live there)."""
    with tempfile.TemporaryDirectory(prefix="t") as temp:
        result = train_quickstart(tmp_path, "--nproc-per-node", "2", "train_iters=20", TMPDIR=temp)
        left = [p.name for p in Path(temp).iterdir() if p.name.startswith(("torchel", "primus-"))]
    assert result.returncode == 0, result.stderr
    assert "torchrun --nproc-per-node=2" in result.stderr and left == []
    logs = tmp_path / "local" / "local" / "quickstart" / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.log", "rank-1.log"]
    assert "rank 0 of 2" in (logs / "rank-0.log").read_text()
    assert "[rank1]" in (logs / "rank-1.log").read_text()
    assert "[primus rank1]" not in result.stderr  # the console is rank 0's by default
    loud = train_quickstart(
        tmp_path, "--nproc-per-node", "2", "train_iters=2", PRIMUS_LOG_ALL_RANKS="1"
    )
    assert loud.returncode == 0 and "[primus rank1]" in loud.stderr


def test_a_backend_with_the_spawn_launcher_starts_workers_without_torch(tmp_path) -> None:
    spawning = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # not importable here; the workers need none either
        from primus.backends.dummy import DummyAdapter
        from primus.core.backend.backend_registry import BackendRegistry
        class SpawnedDummy(DummyAdapter):
            launcher = "spawn"
        BackendRegistry.register_adapter("dummy", SpawnedDummy)
        from primus.cli.main import main
        main(["train", "pretrain", "--config", {str(DUMMY_QUICKSTART)!r}, "--nproc-per-node", "2",
              "train_iters=2"])
    """)
    script = write(tmp_path, "spawning.py", spawning)  # a file: presets are found beside classes
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "PRIMUS_WORKSPACE": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[primus] spawning ranks 0-1 of 2, master 127.0.0.1:" in result.stderr
    logs = next(tmp_path.rglob("logs"))
    assert sorted(p.name for p in logs.iterdir()) == ["rank-0.log", "rank-1.log"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--nnodes", "2", "--node-rank", "1"), "Invalid value for --master-addr: several nodes"),
        (("--nnodes", "2", "--node-rank", "2", "--master-addr", "h0"), "2 is not below --nnodes 2"),
        (("--nnodes", "2", "--master-addr", "node 0"), "'node 0' is not a host name or an IP"),
    ],
)
def test_multi_node_flags_are_checked_before_anything_starts(tmp_path, flags, message) -> None:
    result = train_quickstart(tmp_path, *flags)
    assert result.returncode == 2, result.stderr[-3000:]
    assert message in " ".join(result.stderr.split())
    assert not any(tmp_path.iterdir()) and "Traceback" not in result.stderr


def test_a_failing_worker_fails_the_launch(tmp_path) -> None:
    result = train_quickstart(tmp_path, "--nproc-per-node", "2", "lr=100")
    assert result.returncode == 1 and "a worker failed" in result.stderr


def test_inventory_commands() -> None:
    listed = json.loads(primus("patches", "list", "--backend", "dummy", "--format", "json").stdout)
    assert [r["id"] for r in listed] == [
        "dummy.hash_seed",
        "dummy.checkpoint_dir",
        "dummy.finite_loss",
        "dummy.preemption",
        "dummy.summary",
    ]
    assert listed[2]["target"] == "dummytrain.loop.mse_loss"
    assert listed[2]["code location"].startswith("primus/backends/dummy/patches.py:")
    show = primus("patches", "show", "dummy.finite_loss")
    assert show.returncode == 0 and "## Porting into your own framework" in show.stdout
    assert "Rebind or wrap `dummytrain.loop.mse_loss`" in show.stdout  # code it replaces
    value = primus("patches", "show", "dummy.checkpoint_dir").stdout  # a value it sets
    assert "`dummytrain.TrainConfig.save_dir` is a value, not code" in value
    assert "Rebind" not in value
    missing = primus("patches", "show", "dummy.finite")
    assert missing.returncode == 2 and "did you mean: dummy.finite_loss" in missing.stderr
    unknown = primus("patches", "list", "--backend", "dumy")
    assert unknown.returncode == 2 and "--backend dumy: no such backend (did you mean: dummy?)" in (
        unknown.stderr
    )
    backends = primus("backends", "list")
    assert re.search(
        r"dummy\s+primus-backend-dummy 0.1.0\s+dummytrain<2,>=1.0\s+1.0.0\s+ready", backends.stdout
    )
    provides = backends.stdout.split("what each provides")[1].splitlines()
    header = provides[1].split()
    assert header == ["backend", "pretrain", "posttrain", *CAPABILITIES]
    dummy = next(line.split() for line in provides if line.startswith("dummy "))
    assert dict(zip(header, dummy, strict=True)) == {
        "backend": "dummy", "pretrain": "yes", **{c: "-" for c in header[2:]}
    }  # fmt: skip
    versions = primus("--version").stdout.split("\n")
    assert "primus-core 0.1.0" in versions and "primus-backend-dummy 0.1.0" in versions


def test_a_backend_without_a_memory_projection_says_so() -> None:
    result = primus("projection", "memory", "--config", str(DUMMY_QUICKSTART))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "the dummy backend does not provide memory-projection" in result.stderr


@pytest.mark.parametrize(
    ("outputs", "message"),
    [([], "name what to write: --hf, --adapter or both"),
     (["--hf", "out", "--adapter", "out/"], "the model and the adapter need folders of their own"),
     (["--adapter", "out"], "the experiment has no peft: section, so its checkpoints hold no "
      "adapters hint: export the whole model with --hf")],
)  # fmt: skip
def test_an_export_names_what_it_writes(tmp_path: Path, outputs: list[str], message: str) -> None:
    args = ["checkpoint", "export", "--config", str(DUMMY_QUICKSTART), *outputs]
    result = primus(*args, cwd=tmp_path)
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", result.stderr).split())  # typer's box unwrapped
    assert result.returncode == 2 and message in said, result.stderr[-3000:]
    assert not (tmp_path / "out").exists()


def test_an_output_file_no_folder_holds_is_refused_before_the_work(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    for command in (["projection", "memory"], ["benchmark", "gemm"]):
        out = str(tmp_path / "a-file" / "r.json")
        result = primus(*command, "--config", str(DUMMY_QUICKSTART), "--json", out)
        said = "".join(re.sub("[│╭╮╰╯─]", " ", result.stderr).split())  # typer's box, unwrapped
        assert result.returncode == 2 and "a-fileisnotafolder" in said, result.stderr[-2000:]


def test_shell_completion_installs_and_completes_override_names(tmp_path: Path) -> None:
    """`--show-completion` prints the script; completing after `--config` offers the resolved
    experiment's keys as `key=`, and the backend's once its schema is cached, without importing
    a framework."""
    from primus.core.backend.backend_registry import BackendRegistry
    from primus.core.config.schema_cache import schema_of
    from primus.testing.runs import primus_imports

    # from bash (typer finds the shell among the parent processes), which must not exec it
    show = f"{sys.executable} -m primus.cli --show-completion; exit $?"
    shown = subprocess.run(["bash", "-c", show], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "_PRIMUS_COMPLETE=complete_bash" in shown.stdout
    recipe = Path(__file__).resolve().parents[1] / "configs" / "megatron" / "tiny-cpu.yaml"
    words = f"primus train pretrain --config {recipe} train_i"
    done, imported = primus_imports(
        _PRIMUS_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD="5"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["train_iters="] and imported == []
    schema_of(BackendRegistry.get_adapter_class("megatron")("megatron"))  # as validate caches it
    done, imported = primus_imports(
        _PRIMUS_COMPLETE="complete_bash", COMP_WORDS=words.replace("train_i", "train_s"),
        COMP_CWORD="5",
    )  # fmt: skip
    assert done.stdout.split() == ["train_samples=", "train_sync_interval="] and imported == []


def test_ctrl_c_in_a_command_says_so_exits_130_and_leaves_nothing(tmp_path: Path) -> None:
    """SIGINT while `checkpoint tiny` imports torch (its map in /proc: the command has begun):
    one line, no traceback, and no folder, half-written or staged."""
    import signal
    import time

    def as_a_terminal_starts_it() -> None:  # an ignored SIGINT is inherited, and kept ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "primus.cli", "checkpoint", "tiny", "--hf",
                             str(tmp_path / "hf")], stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_a_terminal_starts_it)  # fmt: skip
    deadline = time.monotonic() + 120
    while "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == "[primus] interrupted (Ctrl-C)", err[-3000:]
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
