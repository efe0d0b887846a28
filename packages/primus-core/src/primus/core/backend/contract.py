"""The adapter contract, checked when an adapter is registered or discovered (pluggy's habit):
a broken adapter is reported then, not at the first call of the hook it gets wrong. The
required hooks are here; the optional ones come with the capabilities that declare them."""

from __future__ import annotations

import inspect
from typing import Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.capabilities import CAPABILITIES, capability_problem
from primus.core.launch.launcher import LAUNCHERS

# How the runtime calls each hook every adapter has: the positional arguments (self aside).
HOOK_ARGS = {
    "__init__": ("framework",),
    "setup_backend_path": (),
    "prepare_backend": ("config",),
    "check_inputs": ("config",),
    "check_params": ("config", "stage"),
    "parallel_sizes": ("config",),
    "check_launch": ("config", "processes"),
    "checkpoint_bytes": ("config",),
    "convert_config": ("config",),
    "load_trainer_class": ("stage",),
    "detect_backend_version": (),
    "param_schema": (),
}


def implements(adapter_cls: type[BackendAdapter], hook: str) -> bool:
    """Whether the adapter class defines `hook` itself (or a class it derives from does),
    rather than inheriting BackendAdapter's default."""
    for klass in adapter_cls.__mro__:
        if klass is BackendAdapter:
            return False
        if hook in vars(klass):
            return True
    return False


def _hook_problem(
    adapter_cls: type[BackendAdapter], hook: str, args: tuple[str, ...]
) -> str | None:
    function = getattr(adapter_cls, hook)
    try:
        inspect.signature(function).bind(None, *args)
    except TypeError:
        shown = ", ".join(("self", *args))
        return (
            f"{adapter_cls.__name__}.{hook}{inspect.signature(function)} cannot be called as "
            f"{hook}({shown}), which is how the runtime calls it"
        )
    return None


def _trainers_problem(adapter_cls: type[BackendAdapter]) -> str | None:
    trainers = adapter_cls.trainers
    if not trainers and not implements(adapter_cls, "load_trainer_class"):
        return (
            f"{adapter_cls.__name__} declares no stages: set trainers = "
            '{"pretrain": "module:TrainerClass"} (or override load_trainer_class)'
        )
    for stage, target in trainers.items():
        if not isinstance(target, str) or target.count(":") != 1:
            return f'{adapter_cls.__name__}.trainers["{stage}"] must be "module:Class"'
    return None


def contract_problem(adapter_cls: Any) -> str | None:
    """Why `adapter_cls` cannot serve as an adapter, or None when it can."""
    if not (inspect.isclass(adapter_cls) and issubclass(adapter_cls, BackendAdapter)):
        return f"{adapter_cls!r} is not a BackendAdapter subclass"
    if inspect.isabstract(adapter_cls):
        missing = ", ".join(sorted(adapter_cls.__abstractmethods__))
        return f"{adapter_cls.__name__} does not implement {missing}"
    if adapter_cls.launcher not in LAUNCHERS:
        return f"{adapter_cls.__name__}.launcher must be one of {', '.join(LAUNCHERS)}"
    unused = adapter_cls.unused_modules
    if not isinstance(unused, tuple) or not all(isinstance(n, str) and n for n in unused):
        return f'{adapter_cls.__name__}.unused_modules must be a tuple of module names ("torch",)'
    problem = _trainers_problem(adapter_cls) or capability_problem(
        adapter_cls, lambda hook: implements(adapter_cls, hook)
    )
    if problem:
        return problem
    hooks = dict(HOOK_ARGS)
    for capability in adapter_cls.capabilities:
        hooks.update(CAPABILITIES[capability].hooks)
    for hook, args in hooks.items():
        problem = _hook_problem(adapter_cls, hook, args)
        if problem:
            return problem
    return None
