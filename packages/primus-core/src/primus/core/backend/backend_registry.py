"""BackendRegistry: backend name -> adapter, from entry points or in-process registration."""

from __future__ import annotations

import importlib
from typing import Any

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.capabilities import CAPABILITIES, provides
from primus.core.backend.contract import contract_problem
from primus.core.backend.discovery import (
    READY,
    BackendInfo,
    check_upstream,
    discover_entry_points,
    load_failure_hint,
)
from primus.core.errors import BackendError, ConfigError, Origin, did_you_mean
from primus.core.logging import get_logger

ENTRY_POINT_HINT = (
    "a backend is found through its distribution's entry point: "
    '[project.entry-points."primus.backends"] NAME = "package.module:AdapterClass" '
    "(docs/writing-a-backend.md; `primus backends new NAME` writes one)"
)


def _qualname(adapter_cls: type) -> str:
    return f"{adapter_cls.__module__}:{adapter_cls.__qualname__}"


class BackendRegistry:
    """Class-level registry. Entry points are discovered once, lazily; `register_adapter`
    adds a backend in this process and is validated on the spot."""

    _registered: dict[str, type[BackendAdapter]] = {}
    _discovered: dict[str, BackendInfo] | None = None

    @classmethod
    def register_adapter(cls, name: str, adapter_cls: type[BackendAdapter]) -> None:
        """Register `adapter_cls` as backend `name` in this process (the original guide's way).

        Registering the class an entry point or an earlier call already gave that name is a
        no-op (a guide-style package registers itself when its entry point is loaded); any
        other class under a taken name is refused.
        """
        problem = contract_problem(adapter_cls)
        if problem:
            raise TypeError(f"backend '{name}': {problem}")
        discovered = (cls._discovered or {}).get(name)
        taken = cls._registered.get(name) or (discovered.adapter_class if discovered else None)
        if taken is not None and _qualname(taken) != _qualname(adapter_cls):
            raise TypeError(
                f"backend '{name}' is already registered as {_qualname(taken)}; "
                f"refusing {_qualname(adapter_cls)} (choose another name)"
            )
        cls._registered[name] = adapter_cls

    @classmethod
    def run_setup(cls, framework: str) -> None:
        """The original backend guide's call to run a backend's setup hooks. The runtime runs
        the setup-phase patches itself, before `prepare_backend`, so this only warns."""
        get_logger().warning(
            f"BackendRegistry.run_setup('{framework}') does nothing: the runtime already ran "
            f"the setup-phase patches of '{framework}' before prepare_backend; remove the call"
        )

    @classmethod
    def backends(cls, refresh: bool = False) -> dict[str, BackendInfo]:
        """Every known backend with its status; entry points first, in-process ones over them."""
        if cls._discovered is None or refresh:
            cls._discovered = discover_entry_points()
        infos = dict(cls._discovered)
        for name, adapter_cls in cls._registered.items():
            ep_info = infos.get(name)
            info = BackendInfo(
                name=name,
                entry_point=_qualname(adapter_cls),
                distribution=ep_info.distribution if ep_info else None,
                version=ep_info.version if ep_info else None,
                upstream_requirement=adapter_cls.upstream_requirement
                or (ep_info.upstream_requirement if ep_info else None),
                adapter_class=adapter_cls,
            )
            check_upstream(info)
            infos[name] = info
        return infos

    @classmethod
    def _find_in_process(cls, name: str) -> None:
        """The original backend guide's lookup for a name no entry point declares: import
        `primus.backends.<name>`, which may call `register_adapter`."""
        if name not in cls._registered and name.isidentifier():
            module = f"primus.backends.{name}"
            try:
                importlib.import_module(module)
            except Exception as exc:
                if isinstance(exc, ModuleNotFoundError) and module.startswith(exc.name or "?"):
                    return  # no such module: the name is unknown
                raise BackendError(
                    f"backend '{name}': importing {module} failed: {type(exc).__name__}: {exc}",
                    hint=load_failure_hint(exc, module, None),
                ) from exc
        if name in cls._registered:
            get_logger().warning(
                f"backend '{name}' is registered in-process only (BackendRegistry."
                f"register_adapter); {ENTRY_POINT_HINT}"
            )

    @classmethod
    def info(cls, name: str) -> BackendInfo:
        infos = cls.backends()
        if name not in infos:
            cls._find_in_process(name)
            infos = cls.backends()
        if name not in infos:
            raise BackendError(
                f"unknown framework '{name}'{did_you_mean(name, infos)}",
                hint=f"installed backends: {', '.join(sorted(infos)) or 'none'}; "
                f"install one with pip install primus-<backend>; {ENTRY_POINT_HINT}",
            )
        return infos[name]

    @classmethod
    def get_adapter_class(cls, name: str, require_ready: bool = True) -> type[BackendAdapter]:
        """The adapter class; with `require_ready`, only if its upstream is installed and fits."""
        info = cls.info(name)
        if info.adapter_class is None or (require_ready and info.status != READY):
            raise BackendError(
                f"backend '{name}' cannot be used: {info.status}: {info.reason}",
                hint=info.install_hint(),
            ) from info.load_error
        adapter_cls = info.adapter_class
        if adapter_cls.upstream_requirement is None and info.upstream_requirement:
            adapter_cls.upstream_requirement = info.upstream_requirement
        return adapter_cls

    @classmethod
    def get_adapter(cls, name: str) -> BackendAdapter:
        """A fresh adapter instance for a ready backend."""
        return cls.get_adapter_class(name)(name)


def require(adapter: Any, capability: str, origin: Origin | None = None) -> None:
    """A ConfigError (at `origin`) unless the adapter declares `capability`: what the backend
    lacks, what it provides, and which ready backends have it."""
    if provides(adapter, capability):
        return
    others = sorted(
        name
        for name, info in BackendRegistry.backends().items()
        if info.adapter_class is not None and provides(info.adapter_class, capability)
    )
    spec = CAPABILITIES[capability]
    raise ConfigError(
        f"the {adapter.framework} backend does not provide {capability}: {spec.summary}",
        origin,
        hint=f"backends that do: {', '.join(others) or 'none installed'}; "
        "primus backends list shows what each provides",
    )
