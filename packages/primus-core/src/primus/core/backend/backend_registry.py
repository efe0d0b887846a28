"""BackendRegistry: backend name -> adapter, from entry points or in-process registration."""

from __future__ import annotations

from primus.core.backend.backend_adapter import BackendAdapter
from primus.core.backend.discovery import (
    READY,
    BackendInfo,
    check_upstream,
    contract_problem,
    discover_entry_points,
)
from primus.core.errors import BackendError, did_you_mean


class BackendRegistry:
    """Class-level registry. Entry points are discovered once, lazily; `register_adapter`
    adds (or replaces) a backend in this process and is validated on the spot."""

    _registered: dict[str, type[BackendAdapter]] = {}
    _discovered: dict[str, BackendInfo] | None = None

    @classmethod
    def register_adapter(cls, name: str, adapter_cls: type[BackendAdapter]) -> None:
        problem = contract_problem(adapter_cls)
        if problem:
            raise TypeError(f"backend '{name}': {problem}")
        cls._registered[name] = adapter_cls

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
                entry_point=f"{adapter_cls.__module__}:{adapter_cls.__qualname__}",
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
    def info(cls, name: str) -> BackendInfo:
        infos = cls.backends()
        if name not in infos:
            installed = ", ".join(sorted(infos)) or "none"
            raise BackendError(
                f"unknown framework '{name}'{did_you_mean(name, infos)}",
                hint=f"installed backends: {installed}; "
                f"install one with pip install primus-<backend>",
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
