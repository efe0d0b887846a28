"""The original backend guide works as written, and so does `primus backends new`.

The guide's dummy backend is built from the guide itself (tests/fixtures/backend-guide, a verbatim
copy of the original): every `**File**:` block becomes that file of a wheel, which adds only what
the guide leaves to the author (pyproject.toml with the entry point, and the optional
`trainer_base.yaml` its module preset extends). It is installed with the primus-core wheel into
a fresh venv, and its section 7.1 experiment trains there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from primus.testing.conformance import BackendConformance

from .conftest import FIXTURES, Venv, check, make_venv, run, uv_path

pytestmark = pytest.mark.slow

GUIDE = FIXTURES / "backend-guide" / "backend-extension-guide.md"
EXPERIMENT = "examples/dummy/configs/dummy_8B-pretrain.yaml"
PYPROJECT = """\
[project]
name = "primus-backend-guide-dummy"
version = "0.0.1"
requires-python = ">=3.12"
dependencies = ["primus-core"]

[project.entry-points."primus.backends"]
dummy = "primus.backends.dummy:DummyAdapter"

[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[tool.hatch.build.targets.wheel]
packages = ["src/primus"]
"""
# The guide's lifecycle (its section 1), as its dummy backend and the runtime log it.
SEED_ORDER = [
    "[Primus:DummyAdapter] setup_backend_path: no-op",
    "BackendRegistry.run_setup('dummy') does nothing",
    "[Primus:DummyAdapter] Backend prepared",
    "[Primus:DummyAdapter] Converted Primus params -> dummy backend_args",
    "[Primus:DummyAdapter] Loaded trainer class: DummyPretrainTrainer",
    "load_trainer_class('pretrain') -> primus.backends.dummy.dummy_pretrain_trainer",
    "[DummyPretrainTrainer] setup() on rank=0",
    "[DummyPretrainTrainer] init()",
    "[DummyPretrainTrainer] train()",
    "[DummyPretrainTrainer] training finished successfully.",
    "[DummyPretrainTrainer] cleanup(on_error=success)",
]


def guide_files() -> dict[str, str]:
    """Each `**File**: path` of the guide with the code block that follows it."""
    pattern = r"\*\*File(?: \d+)?\*\*: `([^`]+)`\s*\n+```\w+\n(.*?)```"
    return dict(re.findall(pattern, GUIDE.read_text(), re.S))


@pytest.fixture(scope="module")
def guide_venv(wheels: Path, scratch: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    project = tmp_path_factory.mktemp("guide") / "primus-backend-guide-dummy"
    files = guide_files()
    assert len(files) == 6, sorted(files)
    for relative, text in files.items():
        base = project if relative.startswith("examples/") else project / "src"
        (base / relative).parent.mkdir(parents=True, exist_ok=True)
        (base / relative).write_text(text)
    (project / "pyproject.toml").write_text(PYPROJECT)
    modules = project / "src/primus/configs/modules/dummy"
    (modules / "trainer_base.yaml").write_text("# the guide's optional shared base\nseed: 1234\n")
    out = project.parent / "dist"
    check(
        run(
            [uv_path(), "build", "--wheel", "--quiet", "--out-dir", str(out), str(project)], project
        )
    )
    venv = make_venv(project.parent / "venv", wheels, scratch, ("primus-core",))
    venv.pip("install", str(next(out.glob("*.whl"))))
    venv.scratch = project  # the guide runs its commands from the project's root
    return venv


def test_the_guides_experiment_validates_and_trains_in_the_seeds_order(
    guide_venv: Venv, tmp_path: Path
) -> None:
    check(guide_venv.primus("config", "validate", EXPERIMENT))
    proc = check(guide_venv.primus("train", "pretrain", "--config", EXPERIMENT, workspace=tmp_path))
    err = proc.stderr
    positions = [err.find(line) for line in SEED_ORDER]
    assert -1 not in positions and positions == sorted(positions), err
    assert "Traceback" not in err
    # a backend without an upstream, a version that is not PEP 440, the guide's log key
    assert (
        "backend dummy (primus-backend-guide-dummy 0.0.1) | no upstream, version dummy-0.0.1" in err
    )
    assert "returned 'dummy-0.0.1', which is not a PEP 440 version" in err
    assert (
        "stderr_sink_level is the original backend guide's name for the experiment's log_level"
        in err
    )
    run_dir = tmp_path / "local" / "local" / "dummy_8B-pretrain"
    log = (run_dir / "logs" / "rank-0.log").read_text()
    assert "DEBUG [rank0] primus: log level DEBUG, set by examples/dummy/configs" in log
    assert "load_trainer_class('pretrain') -> " in log  # the trainer's loading is in the run log
    resolved = (run_dir / "config.resolved.yaml").read_text()
    assert "hello: world" in resolved and "hidden_size: 4096" in resolved  # 7.1 over 7.3


def test_a_stage_the_guides_trainer_does_not_run_is_refused(
    guide_venv: Venv, tmp_path: Path
) -> None:
    proc = guide_venv.primus("train", "posttrain", "--config", EXPERIMENT, workspace=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "its trainer DummyPretrainTrainer runs pretrain" in proc.stderr


def test_presets_in_the_guides_layout_and_under_primus_config_path(
    guide_venv: Venv, tmp_path: Path
) -> None:
    user = tmp_path / "user-presets" / "models" / "dummy"
    user.mkdir(parents=True)
    (user / "dummy_1B.yaml").write_text("model_name: dummy_1B\nhidden_size: 2048\n")
    exp = tmp_path / "exp.yaml"
    model = "modules:\n  pre_trainer:\n    framework: dummy\n    config: dummy_trainer.yaml\n"
    exp.write_text(model + "    model: dummy_1B.yaml\n")
    env = guide_venv.env() | {"PRIMUS_CONFIG_PATH": str(tmp_path / "user-presets")}
    shown = check(run([str(guide_venv.primus_exe), "config", "show", str(exp)], tmp_path, env))
    assert "hidden_size: 2048" in shown.stdout and "train_iters: 1000" in shown.stdout
    exp.write_text(model + "    model: dummy_9B.yaml\n")
    missing = run([str(guide_venv.primus_exe), "config", "show", str(exp)], tmp_path, env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "did you mean: dummy_1B.yaml" in missing.stderr or "dummy_8B.yaml" in missing.stderr
    for folder in (user, user.parent, "site-packages/primus/configs/models/dummy"):
        assert str(folder) in missing.stderr, missing.stderr


def test_the_scaffold_trains_and_passes_its_conformance_suite(
    guide_venv: Venv, tmp_path: Path
) -> None:
    project = tmp_path / "primus-backend-sample"
    check(run([str(guide_venv.primus_exe), "backends", "new", "sample", "--dir", str(project)],
              tmp_path, guide_venv.env()))  # fmt: skip
    for taken, said in (("dummy", "the name of an installed backend"),
                        ("class", "is a Python keyword")):  # fmt: skip
        refused = run([str(guide_venv.primus_exe), "backends", "new", taken, "--dir",
                       str(tmp_path / taken)], tmp_path, guide_venv.env())  # fmt: skip
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert not (tmp_path / taken).exists()
    guide_venv.install(f"{project}[test]")  # primus-testing from the wheels, pytest with it
    listed = json.loads(check(guide_venv.primus("backends", "list", "--json")).stdout)
    assert {b["name"]: b["status"] for b in listed} == {"dummy": "ready", "sample": "ready"}
    example = str(project / "examples" / "sample_tiny-pretrain.yaml")
    proc = check(guide_venv.primus("train", "pretrain", "--config", example, workspace=tmp_path))
    losses = [float(x) for x in re.findall(r"\[sample\] step \d+/20 \| loss ([\d.]+)", proc.stderr)]
    assert len(losses) == 4 and losses[-1] < losses[0], proc.stderr
    suite = run([str(guide_venv.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                project, guide_venv.env())  # fmt: skip
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-2000:]
    suite_tests = sum(name.startswith("test_") for name in dir(BackendConformance))
    assert re.search(rf"\b{suite_tests} passed\b", suite.stdout), suite.stdout[-1000:]
