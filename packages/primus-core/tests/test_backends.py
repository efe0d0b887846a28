"""Backend discovery and the registry: entry points, statuses, contract checks, hints."""

from __future__ import annotations

import pytest

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.backend.discovery import upstream_requirement_of
from primus.core.errors import BackendError, ConfigError

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
