"""PrimusRuntime: the lifecycle order, failures, the run directory (in-process toy backend)."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from primus.core.backend.backend_registry import BackendRegistry
from primus.core.errors import BackendError, ConfigError, PatchError
from primus.core.patches import PatchContext, register_patch
from primus.core.runtime import PrimusRuntime, resolution

from .conftest import EVENTS, RecordingTrainer, ToyAdapter

EXP = """
    workspace: {ws}
    exp_name: run
    user_name: me
    env:
      PRIMUS_TEST_FLAG: true
      PRIMUS_TEST_VALUE: 3
    modules:
      trainer:
        framework: toy
        config: toy_trainer.yaml
"""


@pytest.fixture
def experiment(toy_backend, write, tmp_path):
    for phase in ("setup", "build_args", "before_train", "after_train"):
        register_patch(f"toy.{phase}", backend="toy", phase=phase, description=f"records {phase}")(
            lambda ctx: EVENTS.append(f"patch {ctx.phase}")
        )
    return write("exp.yaml", EXP.format(ws=tmp_path / "ws"))


def test_lifecycle_runs_in_design_order_and_writes_the_run_dir(
    experiment, tmp_path, monkeypatch
) -> None:
    monkeypatch.delenv("PRIMUS_TEST_FLAG", raising=False)
    monkeypatch.setenv("PRIMUS_TEST_VALUE", "2")
    runtime = PrimusRuntime(experiment, ["layers=3"])
    runtime.run()
    assert EVENTS == [
        "patch setup",
        "prepare_backend",
        "convert_config",
        "patch build_args",
        "load_trainer_class",
        "trainer.setup",
        "trainer.init",
        "patch before_train",
        "trainer.train",
        "patch after_train",
        "trainer.cleanup(on_error=False)",
    ]
    assert os.environ["PRIMUS_TEST_FLAG"] == "1" and os.environ["PRIMUS_TEST_VALUE"] == "3"
    run_dir = tmp_path / "ws" / "local" / "me" / "run"
    assert runtime.run_dir == run_dir
    resolved = (run_dir / "config.resolved.yaml").read_text()
    assert "layers: 3  # cli (layers=3) (overrode 1 from" in resolved
    report = json.loads((run_dir / "patch_report.json").read_text())
    assert report["summary"]["applied"] == 4
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "INFO [rank0] primus: primus" in log and "backend toy (in-process)" in log
    assert "env: PRIMUS_TEST_VALUE=3 (was 2)" in log
    assert re.search(r"toy.after_train\s+after_train\s+applied", log)
    # one progress line per start-up phase, in order, each with its time
    phases = re.findall(r"primus: start-up: (.+) in \d+\.\d s\n", log)
    assert phases == [
        "the backend loaded and the config checked",
        "the config converted (setup and build_args patches)",
        "the trainer set up",
        "the model, optimizer and data built",
    ]
    assert re.search(r"primus: start-up: done in \d+\.\d s; training starts\n", log)


def test_a_training_error_cleans_up_and_is_reraised_unchanged(experiment) -> None:
    error = RuntimeError("the step failed")
    RecordingTrainer.fail_in, RecordingTrainer.error = "trainer.train", error
    with pytest.raises(RuntimeError) as raised:
        PrimusRuntime(experiment).run()
    assert raised.value is error
    assert EVENTS[-2:] == ["trainer.train", "trainer.cleanup(on_error=True)"]


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), SystemExit(3)])
def test_interrupts_pass_through_after_cleanup(experiment, interrupt) -> None:
    RecordingTrainer.fail_in, RecordingTrainer.error = "trainer.init", interrupt
    with pytest.raises(type(interrupt)):
        PrimusRuntime(experiment).run()
    assert EVENTS[-1] == "trainer.cleanup(on_error=True)"


def test_a_failing_setup_patch_stops_before_any_training(experiment, tmp_path) -> None:
    @register_patch("toy.broken", backend="toy", phase="setup", priority=1)
    def broken(ctx: PatchContext) -> None:
        """Fails."""
        raise KeyError("missing symbol")

    with pytest.raises(PatchError, match=r"patch 'toy.broken'"):
        PrimusRuntime(experiment).run()
    assert EVENTS == []
    report = json.loads((tmp_path / "ws/local/me/run/patch_report.json").read_text())
    statuses = {p["id"]: p["status"] for p in report["patches"]}
    assert statuses["toy.broken"] == "failed" and statuses["toy.after_train"] == "not run"


def test_a_patch_that_finds_bad_config_stops_the_run_as_bad_config(experiment) -> None:
    @register_patch("toy.checks", backend="toy", phase="setup", priority=1)
    def checks(ctx: PatchContext) -> None:
        """Refuses the config."""
        raise ConfigError("layers must be even here")

    for on_error in ("fail", "warn"):  # a ConfigError is bad input, never a patch to skip
        with pytest.raises(ConfigError, match="layers must be even here"):
            PrimusRuntime(experiment, [f"patches.on_error={on_error}"]).run()
    assert EVENTS == []


def test_a_stage_the_adapter_does_not_declare_fails_before_anything_runs_or_is_written(
    experiment, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(ToyAdapter, "trainers", {"pretrain": "x:Y"})
    with pytest.raises(ConfigError, match="no 'posttrain' stage") as err:
        PrimusRuntime(experiment, stage="posttrain").run()
    assert err.value.hint == "it runs: pretrain"
    assert EVENTS == [] and not (tmp_path / "ws").exists()


def test_a_stage_the_trainer_does_not_declare_is_refused_when_the_adapter_ignores_stage(
    experiment,
) -> None:
    with pytest.raises(ConfigError, match="its trainer RecordingTrainer runs pretrain"):
        PrimusRuntime(experiment, stage="posttrain").run()
    assert "trainer.setup" not in EVENTS and EVENTS[-1] == "load_trainer_class"


def test_config_patch_selection_and_on_error(experiment, tmp_path) -> None:
    register_patch("toy.broken", backend="toy", phase="before_train", description="fails")(
        lambda ctx: 1 / 0
    )
    PrimusRuntime(experiment, ["patches.select=all,-toy.setup", "patches.on_error=warn"]).run()
    report = json.loads((tmp_path / "ws/local/me/run/patch_report.json").read_text())
    statuses = {p["id"]: (p["status"], p["reason"]) for p in report["patches"]}
    assert statuses["toy.setup"] == ("skipped", "filtered by patches.select")
    assert statuses["toy.broken"][0] == "failed" and "trainer.train" in EVENTS


def test_dry_run_converts_but_trains_nothing_and_writes_nothing(
    experiment, tmp_path, capsys
) -> None:
    PrimusRuntime(experiment, ["lr=0.25"]).run(dry_run=True)  # no upstream: nothing converted
    out = capsys.readouterr().out
    assert "# backend args: not built" in out and "before_train  toy.before_train" in out
    assert EVENTS == []
    PrimusRuntime(experiment, ["lr=0.25"]).run(dry_run=True, full=True)
    out = capsys.readouterr().out
    assert "lr: 0.25" in out and "# patch plan" in out
    assert "before_train  toy.before_train" in out and "will apply" in out
    assert EVENTS == [
        "patch setup",
        "prepare_backend",
        "convert_config",
        "patch build_args",
        "load_trainer_class",
    ]
    assert not (tmp_path / "ws").exists()


def test_env_is_applied_before_the_schema_reads_the_upstream(
    experiment, toy_backend, monkeypatch
) -> None:
    monkeypatch.delenv("PRIMUS_TEST_FLAG", raising=False)
    seen = []
    monkeypatch.setattr(
        toy_backend,
        "param_schema",
        lambda self: (
            seen.append(os.environ.get("PRIMUS_TEST_FLAG")) or ToyAdapter.param_schema(self)
        ),
    )
    PrimusRuntime(experiment)
    assert seen == ["1"]


def test_a_source_tree_stands_in_for_a_missing_upstream(
    experiment, toy_backend, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(toy_backend, "upstream_requirement", "no-such-upstream-dist>=1")
    with pytest.raises(BackendError, match="upstream missing"):
        PrimusRuntime(experiment)
    (tmp_path / "src_tree").mkdir()
    monkeypatch.setenv("BACKEND_PATH", str(tmp_path / "src_tree"))
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert PrimusRuntime(experiment).source_tree == str(tmp_path / "src_tree")
    module = resolution.load(experiment, single=True).modules["trainer"]
    assert resolution.backend_for(module)[1] == str(tmp_path / "src_tree")  # as `config validate`


def test_a_broken_patch_module_of_the_backend_itself_is_fatal(write, tmp_path, monkeypatch) -> None:
    from primus.core.patches import registry
    from primus.core.patches.registry import PatchModuleFailure

    error = ImportError("boom")
    failure = PatchModuleFailure("dummy = x", "primus-backend-dummy", "ImportError: boom", error)
    monkeypatch.setattr(registry, "_load_failures", [failure])
    exp = resolution.load(write("e.yaml", "modules: {m: {framework: dummy}}\n"), single=True)
    module = exp.modules["m"]
    with pytest.raises(
        BackendError, match=r"patch module dummy = x \(primus-backend-dummy\) failed"
    ) as err:
        resolution.validate(module, BackendRegistry.get_adapter("dummy"))
    assert err.value.__cause__ is error
    monkeypatch.setattr(
        registry, "_load_failures", [PatchModuleFailure("t", "other-dist", "E", error)]
    )
    resolution.validate(module, BackendRegistry.get_adapter("dummy"))  # another plugin's: a warning
