"""End to end through real wheels (the proof with a third-party backend).

`primus-core`, the toy upstream `dummytrain`, the third-party `primus-backend-dummy` and two
deliberately faulty plugins (`primus-backend-broken`: its adapter raises on import;
`primus-backend-future`: it needs `dummytrain>=2`) are built with `uv build` and installed into
fresh virtual environments. The `primus` executable of those environments is then run as a
subprocess, from a scratch folder, so that nothing of this checkout (its sources, its
`third_party/`, its `.venv`) can stand in for what the wheels ship. (uv itself runs from the
checkout, where `.python-version` tells it, and pyenv, which Python 3.12 to use.)
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import FIXTURES, REPO, Venv, check, make_venv, run

pytestmark = pytest.mark.slow

DUMMY_EXPERIMENT = FIXTURES / "primus-backend-dummy" / "examples" / "dummy_tiny-pretrain.yaml"
FUTURE_EXPERIMENT = FIXTURES / "primus-backend-future" / "examples" / "future-pretrain.yaml"
BROKEN_EXPERIMENT = FIXTURES / "primus-backend-broken" / "examples" / "broken-pretrain.yaml"

DUMMY_PATCHES = {
    "dummy.hash_seed": "setup",
    "dummy.checkpoint_dir": "build_args",
    "dummy.finite_loss": "before_train",
    "dummy.preemption": "before_train",
    "dummy.summary": "after_train",
}
# The runtime's lifecycle (docs/architecture.md), as the dummy backend logs it.
LIFECYCLE = [
    "patch setup",
    "prepare_backend",
    "convert_config",
    "patch build_args",
    "trainer.setup",
    "trainer.init",
    "patch before_train",
    "trainer.train",
    "patch after_train",
    "trainer.cleanup(on_error=False)",
]
BASE_DISTS = ("primus-core", "dummytrain", "primus-backend-dummy")
ALL_DISTS = (*BASE_DISTS, "primus-backend-broken", "primus-backend-future")


@pytest.fixture(scope="module")
def venv(wheels: Path, scratch: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """primus-core + dummytrain + primus-backend-dummy only. Tests leave it as they found it."""
    return make_venv(tmp_path_factory.mktemp("venv") / "venv", wheels, scratch, BASE_DISTS)


@pytest.fixture(scope="module")
def crowded(wheels: Path, scratch: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The base set plus the broken and the future plugin."""
    return make_venv(tmp_path_factory.mktemp("crowded") / "venv", wheels, scratch, ALL_DISTS)


def _backends(venv: Venv) -> dict[str, dict]:
    proc = check(venv.primus("backends", "list", "--json"))
    rows = json.loads(proc.stdout)
    assert isinstance(rows, list)
    return {row["name"]: row for row in rows}


def _assert_clean_failure(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Exit 2, a short message naming the cause, no traceback. Returns stderr's first line."""
    where = f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 2, f"exit code {proc.returncode}{where}"
    assert "Traceback" not in proc.stderr + proc.stdout, where
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, f"no error message{where}"
    assert len(lines) <= 3, f"the error should be short{where}"
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in the error{where}"
    return lines[0]


# -- a healthy install: core + one third-party backend ---------------------------------------


def test_wheels_are_pep420_namespaces(wheels: Path) -> None:
    import zipfile

    for wheel in wheels.glob("*.whl"):
        names = zipfile.ZipFile(wheel).namelist()
        assert "primus/__init__.py" not in names, wheel.name
        assert "primus/backends/__init__.py" not in names, wheel.name
    dummy = next(wheels.glob("primus_backend_dummy-*.whl"))
    names = zipfile.ZipFile(dummy).namelist()
    # presets ship inside the backend's wheel as package data
    assert "primus/backends/dummy/configs/modules/dummy_trainer.yaml" in names
    assert "primus/backends/dummy/configs/models/dummy_tiny.yaml" in names


def test_megatron_wheel_ships_presets_entry_points_and_its_upstream(wheels: Path) -> None:
    import zipfile

    wheel = zipfile.ZipFile(next(wheels.glob("primus_megatron-*.whl")))
    names = wheel.namelist()
    for preset in (
        "modules/megatron_pretrain",
        "models/tiny",
        "models/llama3.2_1B",
        "models/mixtral_8x7B",
    ):
        assert f"primus/backends/megatron/configs/{preset}.yaml" in names
    info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert "[primus.backends]\nmegatron = primus.backends.megatron:MegatronAdapter" in entry_points
    assert "[primus.patches]\nmegatron = primus.backends.megatron.patches" in entry_points
    assert "[primus.commands]" not in entry_points  # `primus data` is core's
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert "Provides-Extra: upstream" in metadata
    assert "Requires-Dist: megatron-core<0.20,>=0.17; extra == 'upstream'" in metadata


PRODUCTS = (
    "primus-core",
    "primus-megatron",
    "primus-torchtitan",
    "primus-maxtext",
    "primus-turbo-kernels",
)


def test_product_wheels_carry_no_test_kit(wheels: Path) -> None:
    """Test helpers and test-only patches ship in primus-testing, which no product requires."""
    import zipfile

    for dist in PRODUCTS:
        wheel = zipfile.ZipFile(next(wheels.glob(f"{dist.replace('-', '_')}-*.whl")))
        names = wheel.namelist()
        testing = [n for n in names if {"testing", "testing.py"} & set(n.split("/"))]
        assert testing == [], f"{dist}: {testing}"
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        assert "primus-testing" not in wheel.read(metadata).decode(), dist


def test_testing_wheel_ships_the_conformance_suite_and_test_only_patches(wheels: Path) -> None:
    import zipfile

    wheel = zipfile.ZipFile(next(wheels.glob("primus_testing-*.whl")))
    names = wheel.namelist()
    for module in ("__init__", "conformance", "runs", "faults", "patches/megatron", "torchtitan"):
        assert f"primus/testing/{module}.py" in names, module
    info = next(n for n in names if n.endswith(".dist-info/METADATA")).rsplit("/", 1)[0]
    entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert "[primus.patches]\nmegatron-testing = primus.testing.patches.megatron" in entry_points
    assert "Requires-Dist: primus-core" in wheel.read(f"{info}/METADATA").decode()


def test_maxtext_wheel_alone_trains_through_maxtext_without_torch(
    wheels: Path, scratch: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`pip install primus-core primus-maxtext`, then `primus train` (the JAX stack from PyPI)."""
    root = tmp_path_factory.mktemp("maxtext") / "venv"
    venv = make_venv(root, wheels, scratch, ("primus-core", "primus-maxtext"))
    assert {"maxtext", "jax", "flax", "orbax-checkpoint"} <= venv.installed()
    assert "torch" not in venv.installed()
    recipe = REPO / "configs" / "maxtext" / "tiny-cpu.yaml"
    workspace = tmp_path_factory.mktemp("ws")
    proc = check(
        venv.primus("train", "pretrain", "--config", str(recipe), "steps=3", workspace=workspace)
    )
    assert "step 3/3 | loss" in proc.stderr
    assert "backend maxtext (primus-maxtext 0.1.0) | upstream maxtext<0.3,>=0.2.5 = " in proc.stderr
    metadata = next(root.glob("lib/python*/site-packages/primus_maxtext-*.dist-info/METADATA"))
    text = metadata.read_text()
    assert "Requires-Dist: maxtext<0.3,>=0.2.5; extra == 'upstream'" in text
    assert "Provides-Extra: cuda" in text and "jax[cuda13]" in text


def test_venv_is_fresh(venv: Venv) -> None:
    assert venv.installed() >= set(BASE_DISTS)
    assert not venv.installed() & {"primus-backend-broken", "primus-backend-future"}
    # the installed primus comes from the wheel, not from this checkout
    proc = check(
        run(
            [str(venv.python), "-c", "import primus.core; print(primus.core.__file__)"],
            cwd=venv.scratch,
            env=venv.env(),
        )
    )
    assert Path(proc.stdout.strip()).is_relative_to(venv.root), proc.stdout
    assert not Path(proc.stdout.strip()).is_relative_to(REPO), proc.stdout


def test_backends_list(venv: Venv) -> None:
    backends = _backends(venv)
    assert set(backends) == {"dummy"}
    dummy = backends["dummy"]
    assert dummy["status"] == "ready", dummy
    assert dummy["distribution"] == "primus-backend-dummy"
    assert dummy["version"] == "0.1.0"
    assert dummy["upstream_requirement"].replace(" ", "") in (
        "dummytrain<2,>=1.0",
        "dummytrain>=1.0,<2",
    )
    assert dummy["upstream_version"] == "1.0.0"

    table = check(venv.primus("backends", "list"))
    assert "dummy" in table.stdout and "ready" in table.stdout


def test_backends_list_imports_no_upstream(venv: Venv) -> None:
    code = (
        "import sys\n"
        "from primus.core.backend.backend_registry import BackendRegistry\n"
        "infos = BackendRegistry.backends()\n"
        "assert infos['dummy'].status == 'ready', infos\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'dummytrain'))\n"
    )
    proc = check(run([str(venv.python), "-c", code], cwd=venv.scratch, env=venv.env()))
    assert proc.stdout.strip() == "[]", proc.stdout


def test_patches_list(venv: Venv) -> None:
    proc = check(venv.primus("patches", "list", "--format", "json"))
    rows = json.loads(proc.stdout)
    assert {row["id"]: row["phase"] for row in rows} == DUMMY_PATCHES
    by_id = {row["id"]: row for row in rows}
    assert all(row["backend"] == "dummy" for row in rows)
    assert by_id["dummy.checkpoint_dir"]["target"] == "dummytrain.TrainConfig.save_dir"
    assert by_id["dummy.finite_loss"]["target"] == "dummytrain.loop.mse_loss"
    assert all(row["target"] for row in rows)
    assert all("patches.py" in row["code location"] for row in rows)


def test_turbo_wheel_adds_its_patches_without_importing_torch(venv: Venv) -> None:
    # --no-deps: this venv has no torch and no Triton, and listing the patches needs neither.
    venv.pip("install", "--no-deps", str(next(venv.wheels.glob("primus_turbo_kernels-*.whl"))))
    try:
        proc = check(venv.primus("patches", "list", "--format", "json"))
        rows = {row["id"]: row for row in json.loads(proc.stdout)}
        assert "warning" not in proc.stderr, proc.stderr
        assert {i for i in rows if i.startswith("dummy.")} == set(DUMMY_PATCHES)
        turbo = {i for i, row in rows.items() if "turbo" in row["tags"]}
        assert {i.split(".")[0] for i in turbo} == {"megatron", "torchtitan"}
        attention = rows["megatron.turbo_attention"]
        assert attention["target"] == (
            "megatron.core.transformer.dot_product_attention.DotProductAttention"
        )
        assert attention["how to enable"].startswith(
            "turbo.enable (default auto: true on a GPU) and turbo.attention (default true) are true"
        )
    finally:
        venv.uninstall("primus-turbo-kernels")


def test_testing_wheel_adds_test_only_patches_without_megatron(venv: Venv) -> None:
    """primus-testing without Megatron: its Megatron patches are listed, nothing is imported."""
    venv.pip("install", "--no-deps", str(next(venv.wheels.glob("primus_testing-*.whl"))))
    try:
        proc = check(venv.primus("patches", "list", "--format", "json"))
        rows = {row["id"]: row for row in json.loads(proc.stdout)}
        assert "warning" not in proc.stderr, proc.stderr
        testing = {i for i, row in rows.items() if "testing" in row["tags"]}
        assert testing == {"megatron.fault_nonfinite", "megatron.log_samples"}
        assert set(rows) - testing == set(DUMMY_PATCHES)
        assert rows["megatron.fault_nonfinite"]["code location"].startswith(
            "primus/testing/patches/megatron.py:"
        )
    finally:
        venv.uninstall("primus-testing")


def test_version(venv: Venv) -> None:
    proc = check(venv.primus("--version"))
    assert "primus-core 0.1.0" in proc.stdout
    assert "primus-backend-dummy 0.1.0" in proc.stdout


def test_train_pretrain(venv: Venv, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    proc = check(
        venv.primus("train", "pretrain", "--config", str(DUMMY_EXPERIMENT), workspace=workspace)
    )
    assert "Traceback" not in proc.stderr

    run_dir = workspace / "local" / "local" / "dummy_tiny-pretrain"
    assert run_dir.is_dir(), sorted(str(p) for p in workspace.rglob("*"))
    resolved = (run_dir / "config.resolved.yaml").read_text()
    assert "dummy" in resolved and "train_iters" in resolved

    report = json.loads((run_dir / "patch_report.json").read_text())
    statuses = {p["id"]: p["status"] for p in report["patches"]}
    assert statuses == dict.fromkeys(DUMMY_PATCHES, "applied"), report

    log = (run_dir / "logs" / "rank-0.log").read_text()
    marker = "[dummy] lifecycle: "
    events = [line.split(marker, 1)[1].strip() for line in log.splitlines() if marker in line]
    events = [e.split(" (rank", 1)[0] for e in events]  # "trainer.setup (rank 0 of 1)"
    assert events == LIFECYCLE, log

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 30  # the experiment's `overrides: train_iters: 30`
    assert summary["last_loss"] < summary["first_loss"], summary


def test_core_metric_params_are_valid_for_a_third_party_backend(venv: Venv) -> None:
    """Core registers log_step_metrics and peak_tflops for every backend, no Primus one needed."""
    experiment = str(DUMMY_EXPERIMENT)
    check(venv.primus("config", "validate", experiment, "log_step_metrics=false", "peak_tflops=9"))
    bad = venv.primus("config", "validate", experiment, "peak_tflops=fast")
    _assert_clean_failure(bad, "peak_tflops: must be a number")


# -- one broken plugin and one with an unmet upstream next to the healthy one ----------------


def test_faulty_plugins_are_reported_not_fatal(crowded: Venv) -> None:
    backends = _backends(crowded)
    assert set(backends) == {"dummy", "broken", "future"}

    assert backends["dummy"]["status"] == "ready", backends["dummy"]

    broken = backends["broken"]
    assert broken["status"] == "failed to load", broken
    assert broken["distribution"] == "primus-backend-broken"
    assert "simulated broken plugin" in broken["reason"]

    future = backends["future"]
    assert future["status"] == "incompatible version", future
    assert future["distribution"] == "primus-backend-future"
    assert future["upstream_requirement"] == "dummytrain>=2"
    assert future["upstream_version"] == "1.0.0"
    assert "dummytrain" in future["reason"]

    table = check(crowded.primus("backends", "list"))
    assert "failed to load" in table.stdout and "incompatible version" in table.stdout
    check(crowded.primus("patches", "list"))
    version = check(crowded.primus("--version")).stdout
    assert "primus-backend-broken" in version and "primus-backend-future" in version


def test_train_with_incompatible_backend(crowded: Venv, tmp_path: Path) -> None:
    proc = crowded.primus(
        "train", "pretrain", "--config", str(FUTURE_EXPERIMENT), workspace=tmp_path
    )
    first = _assert_clean_failure(proc, 'pip install "dummytrain>=2"')
    assert "future" in first and "incompatible version" in first, proc.stderr
    assert not (tmp_path / "local" / "local" / "future-pretrain" / "summary.json").exists()


def test_train_with_broken_backend(crowded: Venv, tmp_path: Path) -> None:
    proc = crowded.primus(
        "train", "pretrain", "--config", str(BROKEN_EXPERIMENT), workspace=tmp_path
    )
    first = _assert_clean_failure(proc)
    assert "broken" in first and "failed to load" in first, proc.stderr
    assert "simulated broken plugin" in proc.stderr
    debug = crowded.primus(
        "--debug", "train", "pretrain", "--config", str(BROKEN_EXPERIMENT), workspace=tmp_path
    )
    assert debug.returncode == 2
    assert re.search(r"Traceback[\s\S]*primus/backends/broken/__init__.py", debug.stderr), (
        debug.stderr
    )


def test_healthy_backend_still_trains_next_to_faulty_ones(crowded: Venv, tmp_path: Path) -> None:
    check(
        crowded.primus("train", "pretrain", "--config", str(DUMMY_EXPERIMENT), workspace=tmp_path)
    )
    assert (tmp_path / "local" / "local" / "dummy_tiny-pretrain" / "summary.json").is_file()


# -- removing things (each test puts back what it removed) ------------------------------------


@pytest.fixture
def without(crowded: Venv) -> Iterator:
    removed: list[str] = []

    def remove(dist: str) -> None:
        crowded.uninstall(dist)
        removed.append(dist)
        assert dist not in crowded.installed()

    yield remove
    if removed:
        crowded.install(*removed)


def test_upstream_missing(crowded: Venv, without, tmp_path: Path) -> None:
    without("dummytrain")
    backends = _backends(crowded)
    assert backends["dummy"]["status"] == "upstream missing", backends["dummy"]
    assert backends["dummy"]["upstream_version"] is None
    assert "dummytrain" in backends["dummy"]["reason"]
    assert backends["broken"]["status"] == "failed to load"

    proc = crowded.primus(
        "train", "pretrain", "--config", str(DUMMY_EXPERIMENT), workspace=tmp_path
    )
    first = _assert_clean_failure(proc, "pip install", "dummytrain")
    assert "upstream missing" in first, proc.stderr
    # the inventory works without the upstream installed
    rows = json.loads(check(crowded.primus("patches", "list", "--format", "json")).stdout)
    assert {row["id"] for row in rows} == set(DUMMY_PATCHES)


def test_backend_wheel_removed(crowded: Venv, without, tmp_path: Path) -> None:
    without("primus-backend-dummy")
    table = crowded.primus("backends", "list")
    check(table)
    assert "dummy" not in table.stdout.replace("dummytrain", "")
    backends = _backends(crowded)
    assert "dummy" not in backends
    assert {"broken", "future"} <= set(backends)
    assert "primus-backend-dummy" not in check(crowded.primus("--version")).stdout

    proc = crowded.primus(
        "train", "pretrain", "--config", str(DUMMY_EXPERIMENT), workspace=tmp_path
    )
    first = _assert_clean_failure(proc)
    assert "unknown framework 'dummy'" in first, proc.stderr


def test_reinstalled_state_is_whole_again(crowded: Venv) -> None:
    """The removal tests put everything back: the crowded venv is as it started."""
    assert crowded.installed() >= set(ALL_DISTS)
    assert _backends(crowded)["dummy"]["status"] == "ready"
