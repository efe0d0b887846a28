"""Backend discovery and the registry: entry points, statuses, contract checks, hints."""

from __future__ import annotations

import re

import pytest

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.backend.discovery import upstream_requirement_of
from primus.core.errors import BackendError, ConfigError
from primus.core.patches import register_patch

from .conftest import ToyAdapter


def test_the_dummy_plugin_is_found_through_its_entry_point() -> None:
    info = BackendRegistry.backends()["dummy"]
    assert (info.distribution, info.status) == ("primus-backend-dummy", "ready")
    assert info.upstream_requirement == "dummytrain<2,>=1.0"
    assert info.upstream_version == "1.0.0"
    assert info.entry_point == "primus.backends.dummy:DummyAdapter"


def test_upstream_requirement_comes_from_the_upstream_extra_only() -> None:
    import importlib_metadata

    assert (
        upstream_requirement_of(importlib_metadata.distribution("primus-backend-dummy"))
        == "dummytrain<2,>=1.0"
    )
    assert upstream_requirement_of(importlib_metadata.distribution("primus-core")) is None


def test_register_adapter_checks_the_contract_at_once() -> None:
    class Incomplete(BackendAdapter):
        def convert_config(self, config):  # load_trainer_class missing
            return config

    with pytest.raises(TypeError, match=r"Incomplete declares no stages"):
        BackendRegistry.register_adapter("bad", Incomplete)
    with pytest.raises(TypeError, match=r"not a BackendAdapter subclass"):
        BackendRegistry.register_adapter("bad", dict)
    hiding = type("Hiding", (ToyAdapter,), {"unused_modules": "torch"})  # not a tuple
    with pytest.raises(TypeError, match=r"Hiding.unused_modules must be a tuple of module names"):
        BackendRegistry.register_adapter("bad", hiding)


class Exporting(ToyAdapter):
    def export_hf(self, backend_args, iteration, out, dtype) -> None:
        pass


@pytest.mark.parametrize(
    ("declared", "base", "problem"),
    [
        ({"hf-export"}, ToyAdapter, " declares 'hf-export' but does not implement export_hf"),
        (set(), Exporting, " implements export_hf but does not declare 'hf-export'"),
        ({"hf-exports"}, Exporting, " declares an unknown capability 'hf-exports' (known: hf-"),
        ({"lora"}, ToyAdapter, " declares 'lora', which needs a posttrain stage"),
        ("lora", ToyAdapter, ".capabilities must be a set of names (hf-import, "),
    ],
)
def test_declared_capabilities_are_verified_at_registration(declared, base, problem) -> None:
    adapter = type("Declaring", (base,), {"capabilities": declared})
    with pytest.raises(TypeError, match=re.escape(f"backend 'bad': Declaring{problem}")):
        BackendRegistry.register_adapter("bad", adapter)


def test_a_capability_hook_is_checked_for_the_arguments_the_runtime_passes() -> None:
    class ExportingBadly(ToyAdapter):
        capabilities = frozenset({"hf-export"})

        def export_hf(self, backend_args) -> None:
            pass

    with pytest.raises(
        TypeError, match=r"called as export_hf\(self, backend_args, iteration, out, dtype\)"
    ):
        BackendRegistry.register_adapter("bad", ExportingBadly)
    declared = type("Good", (Exporting,), {"capabilities": frozenset({"hf-export"})})
    BackendRegistry.register_adapter("exporting", declared)
    assert BackendRegistry.backends()["exporting"].capabilities == ["hf-export"]


@pytest.mark.parametrize(
    ("requirement", "status", "hint"),
    [
        ("pyyaml>=5", "ready", None),
        ("pyyaml>=999", "incompatible version", 'pip install "pyyaml>=999"'),
        ("no-such-upstream-dist>=1", "upstream missing", 'pip install "no-such-upstream-dist>=1"'),
    ],
)
def test_status_from_metadata_and_install_hints(requirement, status, hint) -> None:
    adapter = type("A", (ToyAdapter,), {"upstream_requirement": requirement})
    BackendRegistry.register_adapter("toy2", adapter)
    info = BackendRegistry.backends()["toy2"]
    assert info.status == status and info.install_hint() == hint
    if status == "ready":
        assert isinstance(BackendRegistry.get_adapter("toy2"), adapter)
        assert BackendRegistry.get_adapter("toy2").detect_backend_version() == info.upstream_version
    else:
        with pytest.raises(BackendError, match=f"backend 'toy2' cannot be used: {status}") as err:
            BackendRegistry.get_adapter("toy2")
        assert err.value.hint == hint and isinstance(err.value, ConfigError)
        assert BackendRegistry.get_adapter_class("toy2", require_ready=False) is adapter


def test_unknown_backend_lists_what_is_installed() -> None:
    with pytest.raises(
        BackendError, match=r"unknown framework 'dumy' \(did you mean: dummy\?\)"
    ) as err:
        BackendRegistry.get_adapter("dumy")
    assert "installed backends: dummy" in err.value.hint


def test_setup_backend_path_prefers_a_source_tree(tmp_path, monkeypatch) -> None:
    import sys

    monkeypatch.chdir(tmp_path)
    adapter = ToyAdapter("toy")
    assert adapter.setup_backend_path() == ""
    (tmp_path / "third_party" / "toy").mkdir(parents=True)
    monkeypatch.setattr(sys, "path", list(sys.path))
    folder = adapter.setup_backend_path()
    assert folder == str(tmp_path / "third_party" / "toy") and sys.path[0] == folder
    monkeypatch.setenv("BACKEND_PATH", str(tmp_path))
    assert adapter.setup_backend_path() == str(tmp_path)


def test_a_subclassed_adapter_keeps_its_parents_presets() -> None:
    dummy = BackendRegistry.get_adapter_class("dummy")
    child = type("Child", (dummy,), {})
    assert child.preset_dirs() == dummy.preset_dirs() != []


def test_hook_signatures_are_checked_at_registration() -> None:
    class NoConfigArg(ToyAdapter):
        def prepare_backend(self):  # type: ignore[override]  # the runtime passes the config
            pass

    with pytest.raises(TypeError, match=r"cannot be called as prepare_backend\(self, config\)"):
        BackendRegistry.register_adapter("bad", NoConfigArg)
    bad_trainers = type("BadTrainers", (ToyAdapter,), {"trainers": {"pretrain": "no_colon"}})
    bad_trainers.load_trainer_class = BackendAdapter.load_trainer_class  # type: ignore[method-assign]
    with pytest.raises(TypeError, match=r'trainers\["pretrain"\] must be "module:Class"'):
        BackendRegistry.register_adapter("bad", bad_trainers)


def test_register_adapter_refuses_a_taken_name() -> None:
    BackendRegistry.register_adapter("toy3", ToyAdapter)
    BackendRegistry.register_adapter("toy3", ToyAdapter)  # the same class again: a no-op
    other = type("OtherAdapter", (ToyAdapter,), {})
    with pytest.raises(TypeError, match=r"'toy3' is already registered as .*ToyAdapter"):
        BackendRegistry.register_adapter("toy3", other)
    with pytest.raises(TypeError, match=r"'dummy' is already registered"):
        BackendRegistry.register_adapter("dummy", other)  # a name an entry point holds


def test_run_setup_from_seed_001_warns_and_does_nothing(caplog) -> None:
    assert BackendRegistry.run_setup("dummy") is None
    assert "run_setup('dummy') does nothing" in caplog.text


def _plugin(root, name: str, init: str) -> None:
    """primus/backends/<name>/__init__.py under `root` (a folder put on sys.path)."""
    package = root / "primus" / "backends" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)


@pytest.mark.parametrize(
    ("init", "hint"),
    [
        ("from primus.modules.nosuch import log_rank_0\n", "which this primus-core does not have"),
        ("import no_such_dependency_zz\n", "imports no_such_dependency_zz at "),
        ("x = 1\nraise RuntimeError('bug')\n", "the error is in the plugin's own code at "),
    ],
)
def test_a_plugin_that_fails_to_import_gets_a_hint_fitted_to_the_cause(
    tmp_path, monkeypatch, init, hint
) -> None:
    import importlib

    from primus.core.backend.discovery import load_failure_hint

    _plugin(tmp_path, "hinted", init)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(Exception) as err:
        importlib.import_module("primus.backends.hinted")
    text = load_failure_hint(err.value, "primus.backends.hinted", None)
    assert hint in text and "reinstall" not in text
    if "at " in hint:
        assert f"{tmp_path}/primus/backends/hinted/__init__.py:" in text
    missing_module = ModuleNotFoundError("gone", name="primus.backends.hinted")
    assert "reinstall it" in load_failure_hint(missing_module, "primus.backends.hinted", "dist")


def test_a_backend_registered_in_process_is_found_the_seeds_way(
    tmp_path, monkeypatch, caplog
) -> None:
    """The original backend guide's way: get_adapter imports primus.backends.<name>, which registers."""
    _plugin(
        tmp_path,
        "seedstyle",
        "from primus.core.backend.backend_adapter import BackendAdapter\n"
        "from primus.core.backend.backend_registry import BackendRegistry\n"
        "class SeedAdapter(BackendAdapter):\n"
        "    trainers = {'pretrain': 'some.module:Trainer'}\n"
        "    def convert_config(self, config):\n"
        "        return config.params\n"
        "BackendRegistry.register_adapter('seedstyle', SeedAdapter)\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert BackendRegistry.get_adapter_class("seedstyle").__name__ == "SeedAdapter"
    assert "registered in-process only" in caplog.text and "primus.backends" in caplog.text


def test_an_unknown_framework_explains_entry_points() -> None:
    with pytest.raises(BackendError) as err:
        BackendRegistry.get_adapter("nowhere_zz")
    assert '[project.entry-points."primus.backends"]' in err.value.hint
    from primus.core.runtime import resolution

    register_patch("orphan.fix", backend="orphan", phase="setup", description="x")(lambda c: None)
    with pytest.raises(BackendError) as err:
        resolution.adapter_class("orphan")
    assert "patches for 'orphan' are installed" in err.value.hint


def test_a_version_that_is_not_pep440_warns_naming_the_patches_it_skips(caplog) -> None:
    from primus.core.runtime import resolution

    register_patch(
        "toy.gated", backend="toy", phase="setup", description="x", backend_versions=">=1"
    )(lambda c: None)
    adapter = type("Odd", (ToyAdapter,), {"detect_backend_version": lambda self: "toy-1.0"})("toy")
    assert resolution.backend_version(adapter) == "toy-1.0"
    assert "not a PEP 440 version" in caplog.text and "(toy.gated)" in caplog.text


def test_conformance_takes_own_version_detection_and_backends_without_upstream() -> None:
    import yaml
    from packaging.version import InvalidVersion

    from primus.testing import BackendConformance

    def suite(name: str, adapter: type, **attrs: object) -> BackendConformance:
        BackendRegistry.register_adapter(name, adapter)
        return type("Suite", (BackendConformance,), {"backend": name, **attrs})()

    own = type("Own", (ToyAdapter,), {"detect_backend_version": lambda self: yaml.__version__})
    suite("own_version", own).test_upstream_requirement_and_version()
    pure = type("Pure", (ToyAdapter,), {"upstream_requirement": None})
    suite("pure", pure, has_upstream=False).test_upstream_requirement_and_version()
    odd = type("Odd", (pure,), {"detect_backend_version": lambda self: "pure-0.0.1"})
    with pytest.raises(InvalidVersion):
        suite("odd", odd, has_upstream=False).test_upstream_requirement_and_version()
