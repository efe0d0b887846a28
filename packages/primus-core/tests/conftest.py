"""Fixtures for core's tests: isolated registries and a tiny in-process backend."""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.config import ModuleConfig, ParamSchema, ParamSpec
from primus.core.patches import registry as patch_registry
from primus.core.trainer.base_trainer import BaseTrainer

EVENTS: list[str] = []


@pytest.fixture(autouse=True)
def isolated_registries(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test sees the real entry points plus only what it registers itself. The installed
    patch modules are imported first, into the real registry: imported inside a test's copy,
    their patches would vanish with it and never come back (the import is done once)."""
    patch_registry.load_patch_modules()
    monkeypatch.setattr(patch_registry, "_patches", dict(patch_registry._patches))
    monkeypatch.setattr(BackendRegistry, "_registered", dict(BackendRegistry._registered))
    monkeypatch.delenv("PRIMUS_PATCHES", raising=False)
    EVENTS.clear()
    yield


class RecordingTrainer(BaseTrainer):
    """Records each lifecycle call; `fail_in` makes that step raise."""

    fail_in: str | None = None
    error: BaseException | None = None

    def _step(self, name: str) -> None:
        EVENTS.append(name)
        if self.fail_in == name:
            raise self.error or RuntimeError(f"boom in {name}")

    def setup(self) -> None:
        self._step("trainer.setup")

    def init(self) -> None:
        self._step("trainer.init")

    def train(self) -> None:
        self._step("trainer.train")

    def cleanup(self, on_error: bool = False) -> None:
        EVENTS.append(f"trainer.cleanup(on_error={on_error})")


class ToyAdapter(BackendAdapter):
    """An in-process backend whose upstream is PyYAML (installed, imports nothing new)."""

    upstream_requirement = "pyyaml>=5"
    presets: Path | None = None

    def prepare_backend(self, config: ModuleConfig) -> None:
        EVENTS.append("prepare_backend")

    def convert_config(self, config: ModuleConfig) -> Any:
        EVENTS.append("convert_config")
        return dict(config.params)

    def load_trainer_class(self, stage: str = "pretrain") -> type[BaseTrainer]:
        EVENTS.append("load_trainer_class")  # the original guide's way: it ignores `stage`
        return RecordingTrainer

    def param_schema(self) -> ParamSchema:
        return ParamSchema(
            {
                "lr": ParamSpec(float),
                "layers": ParamSpec(int),
                "name": ParamSpec(str),
                "optim.beta": ParamSpec(float),
                "extra": ParamSpec(dict),
                "mode": ParamSpec(str, choices=("a", "b")),
            }
        )

    @classmethod
    def preset_dirs(cls) -> list[Path]:
        return [cls.presets] if cls.presets else []


@pytest.fixture
def toy_backend(tmp_path: Path) -> type[ToyAdapter]:
    presets = tmp_path / "presets"
    (presets / "modules").mkdir(parents=True)
    (presets / "models").mkdir()
    (presets / "modules" / "toy_trainer.yaml").write_text("lr: 0.1\nlayers: 1\nname: module\n")
    (presets / "models" / "toy_model.yaml").write_text("layers: 2\nname: model\n")
    adapter = type("ToyAdapterForTest", (ToyAdapter,), {"presets": presets})
    BackendRegistry.register_adapter("toy", adapter)
    RecordingTrainer.fail_in, RecordingTrainer.error = None, None
    return adapter


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    """write("name.yaml", text) -> path, with the text dedented."""

    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return _write
