"""The experiment: one YAML file (plus presets and overrides) resolved into one representation."""

from __future__ import annotations

import getpass
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from primus.core.config.loader import load_config_file
from primus.core.config.overrides import parse_overrides
from primus.core.config.schema import ParamSchema, ParamSpec, raise_all
from primus.core.config.tree import ConfigTree, single_value_tree
from primus.core.config.yaml_io import KeyPath
from primus.core.errors import ConfigError, Origin, PrimusError, did_you_mean

PresetDirs = Callable[[str], list[Path]]

EXPERIMENT_SCHEMA = ParamSchema(
    {
        "work_group": ParamSpec(str, "team or project folder under the workspace"),
        "user_name": ParamSpec(str, "user folder under the work group"),
        "exp_name": ParamSpec(str, "experiment name: the run directory's last part"),
        "workspace": ParamSpec(str, "root folder of run directories"),
        "log_level": ParamSpec(str, "log level", choices=("DEBUG", "INFO", "WARNING", "ERROR")),
        "env": ParamSpec(dict, "environment variables set before any backend is imported"),
        "patches.select": ParamSpec(
            (str, list), "which patches may run (same syntax as PRIMUS_PATCHES)"
        ),
        "patches.on_error": ParamSpec(
            str, "a failing patch stops the run, or warns", choices=("fail", "warn")
        ),
        "modules": ParamSpec(dict, "the modules (trainers) of this experiment"),
    }
)
MODULE_KEYS = ("framework", "config", "model", "overrides")


@dataclass
class ModuleConfig:
    """One module of an experiment, with its fully resolved backend params."""

    name: str
    framework: str
    params: dict[str, Any]
    tree: ConfigTree

    def origin(self, dotted_key: str) -> Origin | None:
        return self.tree.origin(tuple(dotted_key.split(".")))

    def error(self, dotted_key: str, message: str, hint: str | None = None) -> ConfigError:
        """A ConfigError pointing at where `dotted_key` was set (for adapters' own checks)."""
        return ConfigError(message, self.origin(dotted_key), hint)


@dataclass
class Experiment:
    path: Path
    tree: ConfigTree
    modules: dict[str, ModuleConfig]

    def _field(self, name: str) -> str:
        return self.tree.data[name]

    work_group = property(lambda self: self._field("work_group"))
    user_name = property(lambda self: self._field("user_name"))
    exp_name = property(lambda self: self._field("exp_name"))
    workspace = property(lambda self: self._field("workspace"))
    log_level = property(lambda self: self._field("log_level"))

    @property
    def env(self) -> dict[str, Any]:
        return self.tree.data.get("env") or {}

    @property
    def patches(self) -> dict[str, Any]:
        return self.tree.data.get("patches") or {}

    @property
    def run_dir(self) -> Path:
        return Path(self.workspace) / self.work_group / self.user_name / self.exp_name


def _find_preset(
    name: str, kind: str, framework: str, base: Path, dirs: list[Path], origin: Origin | None
) -> Path:
    names = [name] if name.endswith((".yaml", ".yml")) else [f"{name}.yaml", name]
    candidates = [base / n for n in names] + [d / kind / n for d in dirs for n in names]
    naming_file = Path(origin.file).resolve() if origin and origin.file else None
    for candidate in candidates:
        if candidate.is_file() and candidate.resolve() != naming_file:  # never itself
            return candidate
    available = sorted(
        p.name for d in dirs if (d / kind).is_dir() for p in (d / kind).glob("*.yaml")
    )
    searched = ", ".join([str(base), *(str(d / kind) for d in dirs)])
    raise ConfigError(
        f"{kind[:-1]} preset '{name}' for framework '{framework}' not found"
        f"{did_you_mean(names[0], available)}",
        origin,
        hint=f"searched {searched}; add folders with PRIMUS_CONFIG_PATH",
    )


def _resolve_module(
    exp: ConfigTree, name: str, base: Path, preset_dirs: PresetDirs, cli: list[ConfigTree]
) -> ModuleConfig:
    path: KeyPath = ("modules", name)
    section = exp.get(path)
    if not isinstance(section, dict):
        raise ConfigError(f"module '{name}' must be a mapping", exp.origin(path))
    for key in section:
        if key not in MODULE_KEYS:
            raise ConfigError(
                f"unknown module key '{key}'{did_you_mean(key, MODULE_KEYS)}",
                exp.origin((*path, key)),
                hint=f"a module has {', '.join(MODULE_KEYS)}",
            )
    framework = section.get("framework")
    if not isinstance(framework, str) or not framework:
        raise ConfigError(f"module '{name}' needs 'framework: <backend name>'", exp.origin(path))
    try:
        dirs = preset_dirs(framework)
    except PrimusError as exc:
        exc.origin = exc.origin or exp.origin((*path, "framework"))
        raise
    params = ConfigTree()
    for key, kind in (("config", "modules"), ("model", "models")):
        ref = section.get(key)
        if ref is None:
            continue
        where = exp.origin((*path, key))
        if not isinstance(ref, str):
            raise ConfigError(f"'{key}' must be a preset name or path", where)
        naming_dir = Path(where.file).parent if where and where.file else base
        preset = _find_preset(ref, kind, framework, naming_dir, dirs, where)
        params.merge(load_config_file(preset, where))
    overrides = section.get("overrides")
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError("'overrides' must be a mapping", exp.origin((*path, "overrides")))
    params.merge(exp.subtree((*path, "overrides")))
    for layer in cli:
        params.merge(layer)
    return ModuleConfig(name, framework, params.data, params)


def _defaults(path: Path) -> dict[str, str]:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "local"
    return {
        "workspace": "./output",
        "work_group": "local",
        "user_name": user,
        "exp_name": path.stem,
        "log_level": "INFO",
    }


def load_experiment(
    path: Path,
    overrides: list[str] | None = None,
    preset_dirs: PresetDirs | None = None,
    module: str | None = None,
    single: bool = False,
) -> Experiment:
    """Resolve an experiment file: extends, interpolation, presets, `overrides:`, CLI overrides.

    Precedence, low to high: module preset < model preset < `overrides:` < CLI. CLI keys that
    name an experiment field (`exp_name`, `patches.select`, `env.X`, ...) set that field;
    any other key is a param of the module. `module` picks one module; None resolves all.
    """
    path = Path(path)
    exp = load_config_file(path)
    defaults = _defaults(path)
    for key, value in defaults.items():
        if key not in exp.data:
            exp.merge(single_value_tree((key,), value, Origin("default")))
    cli_params: list[ConfigTree] = []
    for keypath, value, origin in parse_overrides(overrides or []):
        layer = single_value_tree(keypath, value, origin)
        is_experiment_key = keypath[0] in {k.split(".")[0] for k in EXPERIMENT_SCHEMA.specs}
        (exp.merge(layer) if is_experiment_key else cli_params.append(layer))
    level = exp.data.get("log_level")
    if isinstance(level, str) and level.upper() in (
        EXPERIMENT_SCHEMA.specs["log_level"].choices or ()
    ):
        exp.data["log_level"] = level.upper()
    raise_all(EXPERIMENT_SCHEMA.check(exp, what="experiment key"))
    modules = exp.data.get("modules")
    if not isinstance(modules, dict) or not modules:
        raise ConfigError(
            "the experiment has no modules",
            Origin("file", str(path.resolve()), 1),
            hint="add modules: {<name>: {framework: ..., config: ..., model: ...}}",
        )
    if module is not None and module not in modules:
        raise ConfigError(
            f"no module '{module}' in the experiment{did_you_mean(module, modules)}",
            hint=f"modules: {', '.join(modules)}",
        )
    if single and module is None and len(modules) > 1:
        raise ConfigError(
            f"the experiment has several modules ({', '.join(modules)})",
            hint="choose one with --module NAME",
        )
    names = [module] if module else list(modules)
    lookup = preset_dirs or (lambda framework: [])
    resolved = {
        n: _resolve_module(exp, n, path.resolve().parent, lookup, cli_params) for n in names
    }
    return Experiment(path, exp, resolved)


def resolved_tree(experiment: Experiment) -> ConfigTree:
    """The whole resolved experiment as one tree. Each module's params sit under its
    `overrides:`, so the result is itself a runnable experiment (presets already merged in)."""
    tree = ConfigTree()
    top = experiment.tree.subtree(())
    top.pop("modules")
    tree.merge(top)
    for name, module in experiment.modules.items():
        prefix = ("modules", name)
        fw = experiment.tree.origin((*prefix, "framework")) or Origin("default")
        tree.merge(single_value_tree((*prefix, "framework"), module.framework, fw))
        params = ConfigTree({"modules": {name: {"overrides": module.tree.data}}})
        params.origins = {(*prefix, "overrides", *k): o for k, o in module.tree.origins.items()}
        params.replaced = {(*prefix, "overrides", *k): r for k, r in module.tree.replaced.items()}
        tree.merge(params)
    return tree
