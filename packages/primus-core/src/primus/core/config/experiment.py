"""The experiment: one YAML file (plus presets and overrides) resolved into one representation."""

from __future__ import annotations

import getpass
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from primus.core.config.data_section import DataConfig, data_config
from primus.core.config.init_from import init_from, with_adapter
from primus.core.config.limits import check_env, check_run_dir
from primus.core.config.loader import load_config_file
from primus.core.config.overrides import parse_overrides, repeated
from primus.core.config.posttrain import (
    POSTTRAIN_KEYS,
    DPOConfig,
    PeftConfig,
    SFTConfig,
    dpo_config,
    peft_config,
    sft_config,
)
from primus.core.config.sanity import Rules
from primus.core.config.schema import ParamSchema, ParamSpec, raise_all
from primus.core.config.sections import section_tree
from primus.core.config.tree import ConfigTree, single_value_tree
from primus.core.config.yaml_io import KeyPath
from primus.core.errors import ConfigError, Origin, PrimusError, did_you_mean

# (framework, kind: "modules" | "models") -> the folders that hold such presets, in search order
PresetFolders = Callable[[str, str], list[Path]]

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
# The module's sections beside its params (a CLI override `sft.X=...` sets its key)
SECTIONS = ("init_from", "data", *POSTTRAIN_KEYS)
MODULE_KEYS = ("framework", "config", "model", "overrides", *SECTIONS)
# The original backend guide's module key for the console log level; Primus's is the
# experiment's `log_level`.
LEGACY_LOG_LEVEL = "stderr_sink_level"


@dataclass
class ModuleConfig:
    """One module of an experiment, with its fully resolved backend params."""

    name: str
    framework: str
    params: dict[str, Any]
    tree: ConfigTree
    # `init_from: {hf: DIR}`: the HF model directory the run starts from, and where it was set
    # (its `adapter:`, with LoRA, is `peft.adapter`)
    init_from: Path | None = None
    init_from_origin: Origin | None = None
    # `sft:` and `peft:` (primus.core.config.posttrain), checked, or None where absent
    sft: SFTConfig | None = None
    peft: PeftConfig | None = None
    dpo: DPOConfig | None = None  # `dpo:`: preference training on the sft: data
    data: DataConfig | None = None  # `data:`: the prepared corpus a pretraining run reads

    def origin(self, dotted_key: str) -> Origin | None:
        return self.tree.origin(tuple(dotted_key.split(".")))

    def require_sft(self) -> SFTConfig:
        """The module's `sft:` section; a ConfigError where it has none (a stage that trains on
        it, such as every shipped backend's posttrain)."""
        if self.sft is None:
            raise ConfigError(
                f"the posttrain stage needs the module's sft: section (the data); module "
                f"'{self.name}' has none",
                hint="add sft: {train: ..., tokenizer: ...} under the module (docs/posttrain.md)",
            )
        return self.sft

    def error(self, dotted_key: str, message: str, hint: str | None = None) -> ConfigError:
        """A ConfigError pointing at where `dotted_key` was set (for adapters' own checks)."""
        return ConfigError(message, self.origin(dotted_key), hint)

    def require(self, rules: Rules) -> None:
        """A ConfigError at the first key set to a value its rule refuses (see
        `primus.core.config.sanity`: many upstreams take a 0 or negative size, a negative
        learning rate, junk where a pair of numbers belongs, on trust, and fail only when
        training, or train nothing)."""
        for key, rule in rules.items():
            path = tuple(key.split("."))
            parent = self.tree.get(path[:-1]) if len(path) > 1 else self.tree.data
            if not isinstance(parent, dict) or path[-1] not in parent:
                continue  # unset: the upstream's default
            problem = rule.problem(key, parent[path[-1]])
            if problem:
                raise self.error(key, problem, f"set {key} to {rule.what}")

    def require_divisor(
        self, key: str, divisor_key: str, why: str, defaults: Mapping[str, Any] | None = None
    ) -> None:
        """A ConfigError at `divisor_key` (at `key` where only that is set) unless it divides
        `key`, where both are integers; an unset key takes its value from `defaults`."""
        value, divisor = (
            self.tree.get(tuple(k.split(".")), (defaults or {}).get(k)) for k in (key, divisor_key)
        )
        if isinstance(value, int) and isinstance(divisor, int) and divisor > 0 and value % divisor:
            raise self.error(
                divisor_key if self.origin(divisor_key) is not None else key,
                f"{divisor_key} ({divisor}) must divide {key} ({value}): {why}",
                f"set {divisor_key} to a divisor of {value}",
            )


@dataclass
class Experiment:
    path: Path
    tree: ConfigTree
    modules: dict[str, ModuleConfig]
    notes: list[str] = field(default_factory=list)  # warnings for the run's log

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
    name: str, kind: str, framework: str, folders: list[Path], origin: Origin | None
) -> Path:
    names = [name] if name.endswith((".yaml", ".yml")) else [f"{name}.yaml", name]
    naming_file = Path(origin.file).resolve() if origin and origin.file else None
    for candidate in (folder / n for folder in folders for n in names):
        # os.path.isfile: False, not an OSError, for a name too long for the file system
        if os.path.isfile(candidate) and candidate.resolve() != naming_file:  # never itself
            return candidate
    available = sorted({p.name for d in folders if d.is_dir() for p in d.glob("*.yaml")})
    raise ConfigError(
        f"{kind[:-1]} preset '{name}' for framework '{framework}' not found"
        f"{did_you_mean(names[0], available)}",
        origin,
        hint="searched, in order: "
        + ", ".join(str(f) for f in folders)
        + "; add folders with PRIMUS_CONFIG_PATH (each searched as <dir>/"
        + f"{kind}/{framework}/ and <dir>/{kind}/)",
    )


def _resolve_module(
    exp: ConfigTree, name: str, base: Path, preset_folders: PresetFolders, cli: list[ConfigTree]
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
    params = ConfigTree()
    for key, kind in (("config", "modules"), ("model", "models")):
        ref = section.get(key)
        if ref is None:
            continue
        where = exp.origin((*path, key))
        if not isinstance(ref, str):
            raise ConfigError(f"'{key}' must be a preset name or path", where)
        naming_dir = Path(where.file).parent if where and where.file else base
        try:
            folders = [naming_dir, *preset_folders(framework, kind)]
        except PrimusError as exc:
            exc.origin = exc.origin or exp.origin((*path, "framework"))
            raise
        preset = _find_preset(ref, kind, framework, folders, where)
        params.merge(load_config_file(preset, where))
    overrides = section.get("overrides")
    if overrides is not None and not isinstance(overrides, dict):
        raise ConfigError("'overrides' must be a mapping", exp.origin((*path, "overrides")))
    params.merge(exp.subtree((*path, "overrides")))
    for layer in cli:
        params.merge(layer)
    init, init_origin, adapter = init_from(exp, path)
    sft, peft = sft_config(exp, path, init), peft_config(exp, path)
    dpo, sft = dpo_config(exp, path, sft)
    if adapter is not None:
        peft = with_adapter(peft, adapter, exp.origin((*path, "init_from", "adapter")))
    return ModuleConfig(
        name, framework, params.data, params, init, init_origin, sft, peft, dpo,
        data_config(exp, path),
    )  # fmt: skip


def _adopt_legacy_log_level(exp: ConfigTree, module: ModuleConfig) -> str | None:
    """Move a module's `stderr_sink_level` (the original backend guide's key) to the
    experiment's `log_level`, unless that is set explicitly; return the note that says so."""
    origin = module.tree.origin((LEGACY_LOG_LEVEL,))
    level = module.tree.pop(LEGACY_LOG_LEVEL)
    if level is None:
        return None
    choices = EXPERIMENT_SCHEMA.specs["log_level"].choices or ()
    if not isinstance(level, str) or level.upper() not in choices:
        raise ConfigError(f"{LEGACY_LOG_LEVEL} must be one of {', '.join(choices)}", origin)
    log_level = exp.origin(("log_level",))
    used = log_level is not None and log_level.kind == "default"
    if used:
        exp.merge(single_value_tree(("log_level",), level.upper(), origin or Origin("default")))
    return (
        f"{origin}: {LEGACY_LOG_LEVEL} is the original backend guide's name for the "
        "experiment's log_level; "
        + ("used as log_level" if used else f"ignored, log_level is set at {log_level}")
        + "; write log_level at the top of the experiment instead"
    )


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
    preset_folders: PresetFolders | None = None,
    module: str | None = None,
    single: bool = False,
) -> Experiment:
    """Resolve an experiment file: extends, interpolation, presets, `overrides:`, CLI overrides.

    Precedence, low to high: module preset < model preset < `overrides:` < CLI. CLI keys that
    name an experiment field (`exp_name`, `patches.select`, `env.X`, ...) set that field;
    `init_from.X`, `data.X`, `sft.X`, `peft.X` and `dpo.X` set that key of each module's section; any other key
    is a param of the module. `module` picks one module; None resolves all.
    """
    path = Path(path)
    exp = load_config_file(path)
    defaults = _defaults(path)
    for key, value in defaults.items():
        if key not in exp.data:
            exp.merge(single_value_tree((key,), value, Origin("default")))
    cli_params: list[ConfigTree] = []
    # init_from.*, data.*, sft.*, peft.*, dpo.*: each module's section
    cli_sections: list[tuple[KeyPath, Any, Origin]] = []
    parsed = parse_overrides(overrides or [])
    for keypath, value, origin in parsed:
        if keypath[0] in SECTIONS:
            cli_sections.append((keypath, value, origin))
            continue
        layer = single_value_tree(keypath, value, origin)
        is_experiment_key = keypath[0] in {k.split(".")[0] for k in EXPERIMENT_SCHEMA.specs}
        (exp.merge(layer) if is_experiment_key else cli_params.append(layer))
    level = exp.data.get("log_level")
    if isinstance(level, str) and level.upper() in (
        EXPERIMENT_SCHEMA.specs["log_level"].choices or ()
    ):
        exp.data["log_level"] = level.upper()
    raise_all(EXPERIMENT_SCHEMA.check(exp, what="experiment key"))
    check_run_dir(exp)
    check_env(exp)
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
    names = [module] if module else list(modules)
    for n in names:
        for keypath, value, origin in cli_sections:
            exp.merge(single_value_tree(("modules", n, *keypath), value, origin))
    lookup = preset_folders or (lambda framework, kind: [])
    resolved = {
        n: _resolve_module(exp, n, path.resolve().parent, lookup, cli_params) for n in names
    }
    if single and len(resolved) > 1:  # after each module is checked: its errors come first
        raise ConfigError(
            f"the experiment has several modules ({', '.join(modules)})",
            hint="choose one with --module NAME",
        )
    notes = repeated(parsed)
    notes += [n for m in resolved.values() if (n := _adopt_legacy_log_level(exp, m))]
    return Experiment(path, exp, resolved, notes)


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
        if module.init_from is not None:
            where = module.init_from_origin or Origin("default")
            hf = (*prefix, "init_from", "hf")
            tree.merge(single_value_tree(hf, str(module.init_from), where))
        if module.peft is not None and module.peft.adapter is not None:
            where = module.peft.origins.get("adapter") or Origin("default")
            adapter = (*prefix, "init_from", "adapter")
            tree.merge(single_value_tree(adapter, str(module.peft.adapter), where))
        for key in ("data", *POSTTRAIN_KEYS):
            if (section := getattr(module, key)) is not None:
                tree.merge(section_tree(prefix, key, section))
        params = ConfigTree({"modules": {name: {"overrides": module.tree.data}}})
        params.origins = {(*prefix, "overrides", *k): o for k, o in module.tree.origins.items()}
        params.replaced = {(*prefix, "overrides", *k): r for k, r in module.tree.replaced.items()}
        tree.merge(params)
    return tree
