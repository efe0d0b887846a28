"""The runtime that drives a backend through the Primus lifecycle."""

from primus.core.runtime.primus_runtime import PrimusRuntime

__all__ = ["PrimusRuntime"]
