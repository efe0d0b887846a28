"""The patch engine: register patches, select them, run them by phase, report on them.

A patch changes things only through its context: `ctx.set_param`, `ctx.replace`, `ctx.wrap`.
"""

from primus.core.patches.patch import PHASES, TESTED, Patch, PatchContext, get_args, get_param
from primus.core.patches.rebind import restore_all
from primus.core.patches.registry import register_patch

__all__ = [
    "PHASES",
    "TESTED",
    "Patch",
    "PatchContext",
    "get_args",
    "get_param",
    "register_patch",
    "restore_all",
]
