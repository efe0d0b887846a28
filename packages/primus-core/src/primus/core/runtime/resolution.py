"""Loading an experiment for a backend and checking it: shared by `train` and `config`."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, NamedTuple

from packaging.version import InvalidVersion, Version

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.backend_registry import ENTRY_POINT_HINT, BackendRegistry, require
from primus.core.config.experiment import Experiment, ModuleConfig, load_experiment
from primus.core.config.inputs import check_inputs
from primus.core.config.schema import raise_all, registered_params
from primus.core.config.schema_cache import schema_of
from primus.core.config.tree import ConfigTree, single_value_tree
from primus.core.errors import BackendError, ConfigError
from primus.core.logging import get_logger, log_rank_0
from primus.core.patches.registry import all_patches, load_patch_modules
from primus.core.patches.selection import PatchSelection, selection_for
from primus.core.trainer.base_trainer import BaseTrainer


def preset_folders(framework: str, kind: str) -> list[Path]:
    """Where `kind` ("modules" or "models") presets of `framework` are looked for, in order.

    $PRIMUS_CONFIG_PATH folders first (users may shadow presets), each as <dir>/<kind>/<framework>
    and <dir>/<kind>; then the adapter's own (`preset_dirs()`, <dir>/<kind>); then the original
    Primus layout, primus/configs/<kind>/<framework> in any installed distribution.
    """
    user = [Path(p) for p in os.environ.get("PRIMUS_CONFIG_PATH", "").split(os.pathsep) if p]
    adapter = adapter_class(framework)
    namespace = importlib.import_module("primus").__path__  # every distribution's primus/
    return [
        *(folder for root in user for folder in (root / kind / framework, root / kind)),
        *(root / kind for root in adapter.preset_dirs()),
        *(Path(root) / "configs" / kind / framework for root in namespace),
    ]


def adapter_class(framework: str) -> type[BackendAdapter]:
    """The framework's adapter class, ready or not. The patch modules are imported first: one
    may register its backend in-process (the original backend guide's way). An unknown name
    whose patches are installed says so."""
    load_patch_modules()
    try:
        return BackendRegistry.get_adapter_class(framework, require_ready=False)
    except BackendError as exc:
        modules = sorted({p.module for p in all_patches(framework)})
        if modules and framework not in BackendRegistry.backends():
            exc.hint = (
                f"patches for '{framework}' are installed ({', '.join(modules)}), but no "
                f"backend named '{framework}' is: {ENTRY_POINT_HINT}"
            )
        raise


def load(
    config: Path,
    overrides: list[str] | None = None,
    module: str | None = None,
    single: bool = False,
) -> Experiment:
    """The experiment resolved, each module's `data:` section turned into its backend's params."""
    experiment = load_experiment(config, overrides, preset_folders, module, single)
    for each in experiment.modules.values():
        if each.data is not None:
            experiment.notes += apply_data(each, experiment.tree)
    return experiment


def apply_data(module: ModuleConfig, experiment: ConfigTree) -> list[str]:
    """Lay the params the backend reads `data:` with (`corpus_params`) over the module's, each
    with its `data:` line as origin. Where the experiment itself (not a preset) sets one to
    another value, a note says which is kept: the later layer's (the command line over the
    file, a file over those it extends), and the experiment's over a `data:` default. Set in
    the same layer as the `data:` key that names it (its path, sequence length, seed), it is a
    ConfigError: the run would not read what one of the two says. One the section only implies
    (mock data off) is the section's."""
    assert module.data is not None
    data = module.data
    adapter = adapter_class(module.framework)(module.framework)
    require(adapter, "corpus", data.origins[""])
    notes = []
    for key, (value, source) in adapter.corpus_params(data).items():
        path = tuple(key.split("."))
        origin, old = module.tree.origin(path), module.tree.get(path)
        where = data.origins.get(source) or data.origins[""]
        mine = origin is not None and (origin.kind == "cli" or origin.file in experiment.files)
        if not mine or old == value:
            module.tree.merge(single_value_tree(path, value, where))
            continue
        said, written = f"data.{source or 'path'}", source in data.origins
        if experiment.layer(origin) > experiment.layer(where) or (source and not written):
            why = "set later than" if written or not source else "set, over the default of"
            notes.append(f"{origin}: {key} {old!r}, {why} {said} ({value!r}), is kept")
            continue
        if source and experiment.layer(origin) == experiment.layer(where):
            raise data.error(
                source,
                f"{said} sets {key} to {value!r}, and {origin} sets it to {old!r}",
                hint=f"keep one: drop {key} from the module's overrides, or {said}",
            )
        notes.append(f"{origin}: {key} {old!r} is replaced by {value!r} from {said} at {where}")
        module.tree.merge(single_value_tree(path, value, where))
    return notes


def apply_env(env: dict[str, Any]) -> list[str]:
    """Set the experiment's `env:` variables (booleans as 1/0); say which values they replaced."""
    changes = []
    for name, value in env.items():
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        if os.environ.get(name, text) != text:
            changes.append(f"env: {name}={text} (was {os.environ[name]})")
        os.environ[name] = text
    return changes


class Resolved(NamedTuple):
    """A module's adapter, its upstream source tree ("" for the installed upstream), and why
    only the full check (the upstream imported) can judge its params, or None."""

    adapter: BackendAdapter
    source_tree: str
    undecided: str | None


def backend_for(
    module: ModuleConfig, converting: bool = False, inputs: bool = False, stage: str = "pretrain"
) -> Resolved:
    """The module's adapter, checked as training checks it, with its upstream source tree.

    `inputs` (a run, a dry run, `config validate`: the stage is the one to train): the stage
    takes the module's data (the pretrain stage refuses an sft: section), and the files the
    module reads are checked (`primus.core.config.inputs`, then the adapter's `check_inputs`),
    before anything imports the upstream. A source tree
    (`setup_backend_path`) stands in for an installed upstream; without one the backend must
    be ready. Then the params are validated. The modules the backend never uses
    (`unused_modules`) are hidden before the upstream is imported. `converting`: this process
    only converts a checkpoint; the adapter is told (`host_only`).
    """
    framework = module.framework
    adapter = adapter_class(framework)(framework)
    pretraining = stage == "pretrain" and "posttrain" in adapter.trainers
    if inputs and module.sft is not None and pretraining:
        raise module.sft.error("", "sft: is the data fine-tuning reads; pretraining would "
                               "train on data: (or mock data) and leave it unread",
                               hint="run primus train posttrain, or remove sft:")  # fmt: skip
    hide_modules(adapter.unused_modules)  # before the inputs' check imports transformers
    if inputs:
        check_inputs(module)
        adapter.check_inputs(module)
    if converting:
        adapter.host_only = True
    source_tree = adapter.setup_backend_path()
    if not source_tree:
        BackendRegistry.get_adapter_class(framework)  # raises unless ready
    return Resolved(adapter, source_tree, validate(module, adapter, source_tree, stage))


def hide_modules(names: tuple[str, ...]) -> None:
    """Make importing each of `names` not imported yet fail as if it were not installed
    (`importlib.util.find_spec` finds nothing), for the rest of this process; said at debug
    level. (A process that runs several backends in turn must not hide any.)"""
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    if hidden:
        log_rank_0(f"not needed here, not imported: {', '.join(hidden)}", logging.DEBUG)


def unhide_modules(names: tuple[str, ...]) -> None:
    """Undo `hide_modules` for `names`: importing them works again (a command that builds a
    backend's job and then needs, say, torch itself)."""
    for name in names:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


def validate(
    module: ModuleConfig, adapter: BackendAdapter, source_tree: str = "", stage: str = "pretrain"
) -> str | None:
    """Check a module's params against the backend schema (cached: `schema_cache.schema_of`)
    plus registered Primus keys, then the adapter's `check_params`; return why only the full
    check can judge them (what `check_params` returned), or None.

    A patch module of the backend's own distribution that fails to import stops here (the
    backend is broken); one from another distribution is a warning.
    """
    if module.data is not None and stage != "pretrain":
        raise module.data.error("", f"data: is the corpus pretraining reads; {stage} reads sft:")
    own = BackendRegistry.info(module.framework).distribution
    for failure in load_patch_modules():
        message = f"patch module {failure.entry_point} ({failure.distribution}) failed to import: {failure.error}"
        if own is not None and failure.distribution == own:
            raise BackendError(
                message, hint="--debug shows the import traceback"
            ) from failure.exception
        get_logger().warning(message)
    schema = schema_of(adapter, source_tree)
    if schema is None:
        get_logger().warning(
            f"backend '{module.framework}' declares no parameter schema: "
            "unknown keys cannot be detected"
        )
    else:
        raise_all(schema.merged(registered_params(module.framework)).check(module.tree))
    undecided = adapter.check_params(module, stage)
    if module.init_from is not None:
        check_init_from(module, adapter)
    if module.peft is not None:
        require(adapter, "lora", module.peft.origins.get("type") or module.peft.origins.get(""))
    if module.dpo is not None:
        require(adapter, "dpo", module.dpo.origins.get(""))
    return undecided


def check_init_from(module: ModuleConfig, adapter: BackendAdapter) -> None:
    """`init_from` needs a backend that imports HF checkpoints, and the same architecture."""
    from primus.core.checkpoint.convert import check_architecture

    assert module.init_from is not None
    require(adapter, "hf-import", module.init_from_origin)
    check_architecture(adapter, module, module.init_from)


def backend_version(adapter: BackendAdapter) -> str | None:
    """`adapter.detect_backend_version()`; a version that is not PEP 440 is kept, with a
    warning that names the version-gated patches it makes skip."""
    version = adapter.detect_backend_version()
    if version is None:
        return None
    try:
        Version(version)
    except InvalidVersion:
        gated = [p.id for p in all_patches(adapter.framework) if p.backend_versions is not None]
        skipped = ", ".join(gated) if gated else "none is registered now"
        get_logger().warning(
            f"{type(adapter).__name__}.detect_backend_version() returned '{version}', which is "
            f"not a PEP 440 version (like '0.0.1'): version-gated patches of "
            f"'{adapter.framework}' will be skipped ({skipped})"
        )
    return version


def trainer_class(adapter: BackendAdapter, stage: str) -> type[BaseTrainer]:
    """The adapter's trainer class for `stage`, checked: a BaseTrainer that declares `stage`."""
    klass = adapter.load_trainer_class(stage)
    name = f"{type(adapter).__name__}.load_trainer_class('{stage}')"
    if not (isinstance(klass, type) and issubclass(klass, BaseTrainer)):
        raise BackendError(f"{name} returned {klass!r}, not a BaseTrainer subclass")
    if stage not in klass.stages:
        raise ConfigError(
            f"the {adapter.framework} backend has no '{stage}' stage: its trainer "
            f"{klass.__qualname__} runs {', '.join(klass.stages)}",
            hint=f"a trainer declares what it runs: stages = ({stage!r},) in {klass.__qualname__}",
        )
    get_logger().info(f"{name} -> {klass.__module__}.{klass.__qualname__}")
    return klass


def patch_selection(experiment: Experiment) -> PatchSelection:
    """The selection in force, checked against the registered patch ids."""
    selection = selection_for(experiment.patches.get("select"))
    try:
        selection.check_ids(p.id for p in all_patches())
    except ConfigError as exc:
        if selection.source == "patches.select":  # else PRIMUS_PATCHES named it
            exc.origin = exc.origin or experiment.tree.origin(("patches", "select"))
        raise
    return selection
