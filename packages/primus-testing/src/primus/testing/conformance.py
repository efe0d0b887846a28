"""BackendConformance: the contract tests, written once and run by every backend."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.backend.capabilities import CAPABILITIES
from primus.core.backend.contract import contract_problem, implements
from primus.core.backend.discovery import READY
from primus.core.config.loader import load_config_file
from primus.core.config.schema import registered_params
from primus.core.config.schema_cache import decode, encode
from primus.core.errors import ConfigError
from primus.core.patches.patch import PHASES
from primus.core.patches.registry import all_patches, load_patch_modules
from primus.core.runtime import resolution
from primus.testing.runs import primus

_IMPORT_PROBE = """
import importlib.abc, json, sys
blocked = set(sys.argv[2].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in blocked:
            raise ImportError("conformance probe: upstream import of " + name)
sys.meta_path.insert(0, Block())
from primus.core.backend.backend_registry import BackendRegistry
from primus.core.patches.registry import all_patches, load_patch_modules
info = BackendRegistry.backends()[sys.argv[1]]
failures = [f.entry_point + ": " + f.error for f in load_patch_modules()]
print(json.dumps({"loaded": info.adapter_class is not None, "reason": info.reason,
                  "patch_failures": failures, "patches": len(all_patches(sys.argv[1])),
                  "upstream_imported": sorted(blocked & set(sys.modules))}))
"""


class BackendConformance:
    """Set the class attributes in a subclass named `Test...`; pytest collects the tests.

    A backend with no upstream framework (pure Python, like the example `dummy` backend) sets
    `has_upstream = False` and names no `upstream_modules`.
    """

    backend: ClassVar[str]
    has_upstream: ClassVar[bool] = True
    upstream_modules: ClassVar[tuple[str, ...]] = ()
    example_config: ClassVar[Path]
    smoke_overrides: ClassVar[list[str]] = []

    def adapter(self) -> BackendAdapter:
        return BackendRegistry.get_adapter(self.backend)

    def train(self, *args: str, workspace: Path) -> subprocess.CompletedProcess[str]:
        """`primus train pretrain --config <example> workspace=<workspace> ARGS <smoke
        overrides>`: the workspace on the command line beats whatever the example says."""
        return primus(
            "train", "pretrain", "--config", str(self.example_config), f"workspace={workspace}",
            *args, *self.smoke_overrides,
        )  # fmt: skip

    def test_discovered_through_entry_point_and_ready(self) -> None:
        info = BackendRegistry.backends()[self.backend]
        assert info.distribution, "register the adapter through the primus.backends entry point"
        assert info.status == READY, f"{info.status}: {info.reason}"
        assert issubclass(info.adapter_class, BackendAdapter)

    def test_upstream_requirement_and_version(self) -> None:
        info = BackendRegistry.backends()[self.backend]
        version = self.adapter().detect_backend_version()
        if version is not None:
            Version(version)  # raises unless PEP 440: the patches' version gates compare it
        if not self.has_upstream:
            assert info.upstream_requirement is None, "has_upstream = False, yet one is declared"
            return
        assert info.upstream_requirement, "declare the upstream in the `upstream` extra"
        req = Requirement(info.upstream_requirement)
        assert info.upstream_version, f"the upstream {req.name} is not installed"
        assert req.specifier.contains(info.upstream_version, prereleases=True)
        detected = version if version is not None else info.upstream_version
        assert req.specifier.contains(detected, prereleases=True), detected
        if not implements(type(self.adapter()), "detect_backend_version"):
            assert version == info.upstream_version

    def test_contract_and_declared_capabilities(self) -> None:
        """The hooks every adapter has, and those of each capability it declares, take the
        runtime's arguments; a capability's hook is implemented only with it declared."""
        adapter_cls = type(self.adapter())
        assert contract_problem(adapter_cls) is None, contract_problem(adapter_cls)
        declared = BackendRegistry.backends()[self.backend].capabilities or []
        assert set(declared) == set(adapter_cls.capabilities) <= set(CAPABILITIES)
        for name in declared:
            assert all(implements(adapter_cls, hook) for hook in CAPABILITIES[name].hooks)

    @pytest.mark.slow
    def test_adapter_and_patches_import_without_upstream(self) -> None:
        assert self.upstream_modules or not self.has_upstream, "name the upstream's modules"
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE, self.backend, ",".join(self.upstream_modules)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        probe = json.loads(out.stdout.strip().splitlines()[-1])
        assert probe["loaded"], probe["reason"]
        assert probe["patch_failures"] == []
        assert probe["upstream_imported"] == []

    def test_schema_is_declared(self) -> None:
        schema = self.adapter().param_schema()
        assert schema is not None and len(schema) > 0, "declare param_schema()"

    def test_schema_can_be_cached(self) -> None:
        """Types among bool, int, float, str, list, dict; choices and defaults plain data:
        else every `config validate` reads the schema from the upstream, importing it."""
        schema = self.adapter().param_schema()
        assert schema is not None
        cached = decode(json.loads(json.dumps(encode(schema))))
        assert cached.specs == schema.specs and cached.hints == schema.hints

    def test_presets_resolve_and_validate(self) -> None:
        load_patch_modules()
        declared = self.adapter().param_schema()
        assert declared is not None, "presets are validated against param_schema(): declare it"
        schema = declared.merged(registered_params(self.backend))
        presets = [
            p
            for kind in ("modules", "models")
            for folder in resolution.preset_folders(self.backend, kind)
            for p in sorted(folder.glob("*.yaml"))
        ]
        assert presets, "ship module and model presets under configs/modules and configs/models"
        for preset in presets:
            assert schema.check(load_config_file(preset)) == [], preset

    def test_patches_are_well_formed(self) -> None:
        load_patch_modules()
        for patch in all_patches(self.backend):
            assert patch.phase in PHASES and patch.description, patch.id
            assert ".py:" in patch.location, f"{patch.id}: handler source not found"

    def test_unknown_parameter_is_a_config_error(self) -> None:
        experiment = resolution.load(self.example_config, ["no_such_param_zz=1"], single=True)
        module = next(iter(experiment.modules.values()))
        try:
            resolution.validate(module, self.adapter())
        except ConfigError as exc:
            assert "no_such_param_zz" in exc.message and exc.origin is not None
        else:
            raise AssertionError("an unknown parameter was accepted")

    def test_the_example_fits_a_launch_of_one_model_replica(self) -> None:
        """`parallel_sizes` gives positive sizes and `check_launch` accepts the processes that
        one model replica of the example spans, without the upstream."""
        experiment = resolution.load(self.example_config, [], single=True)
        module = next(iter(experiment.modules.values()))
        adapter = self.adapter()
        sizes = adapter.parallel_sizes(module)
        assert all(isinstance(v, int) and v > 0 for v in sizes.values()), sizes
        adapter.check_launch(module, math.prod(sizes.values()))

    @pytest.mark.slow
    def test_dry_run_trains_nothing(self, tmp_path: Path) -> None:
        result = self.train("--dry-run", workspace=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "# patch plan" in result.stdout
        assert not any(tmp_path.iterdir()), "a dry run must not write a run directory"

    @pytest.mark.slow
    def test_lifecycle_end_to_end(self, tmp_path: Path) -> None:
        result = self.train(workspace=tmp_path)
        assert result.returncode == 0, result.stderr[-4000:]
        run_dirs = [p.parent for p in tmp_path.rglob("patch_report.json")]
        assert len(run_dirs) == 1
        run_dir = run_dirs[0]
        assert (run_dir / "config.resolved.yaml").is_file()
        assert (run_dir / "logs" / "rank-0.log").is_file()
        report = json.loads((run_dir / "patch_report.json").read_text())
        assert report["backend"] == self.backend
        assert [p["id"] for p in report["patches"] if p["status"] in ("failed", "not run")] == []
