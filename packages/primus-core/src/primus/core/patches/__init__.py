"""The patch engine: register patches, select them, run them by phase, report on them."""

from primus.core.patches.patch import PHASES, Patch, PatchContext, get_args, get_param
from primus.core.patches.rebind import rebind
from primus.core.patches.registry import register_patch

__all__ = ["PHASES", "Patch", "PatchContext", "get_args", "get_param", "rebind", "register_patch"]
