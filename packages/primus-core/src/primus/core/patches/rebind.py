"""Replace an upstream name everywhere it is bound, not only in the module that defines it."""

from __future__ import annotations

import sys
from typing import Any


def rebind(owner: Any, name: str, replacement: Any, *, within: str) -> list[str]:
    """Set `owner.name = replacement`, and every module global under package `within` that is
    the same object as the original (a `from owner import name` copy). Returns the
    `module.name` sites rebound. Idempotent: run again, it finds the replacement and stops.
    """
    original = getattr(owner, name)
    if original is replacement:
        return []
    sites = []
    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == within or mod_name.startswith(within + ".")):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)
                sites.append(f"{mod_name}.{attr}")
    if getattr(owner, name) is not replacement:  # owner is a class, or outside `within`
        setattr(owner, name, replacement)
        sites.append(f"{getattr(owner, '__module__', owner)}.{name}")
    return sites
