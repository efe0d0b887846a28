"""Which patches may run: `PRIMUS_PATCHES` or the config's `patches.select`.

Syntax: `all` (default), `none`, `a,b` (only these), `-a,-b` (all but these), `all,-a`.
PRIMUS_PATCHES, when set, replaces `patches.select`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from primus.core.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class PatchSelection:
    source: str
    include: frozenset[str] | None = None  # None: every patch
    exclude: frozenset[str] = field(default_factory=frozenset)

    def allows(self, patch_id: str) -> bool:
        return (self.include is None or patch_id in self.include) and patch_id not in self.exclude

    def check_ids(self, known: Iterable[str]) -> None:
        """A selection naming a patch that does not exist is a typo: say so."""
        known = set(known)
        for pid in sorted((self.include or frozenset()) | self.exclude):
            if pid not in known:
                raise ConfigError(
                    f"{self.source} names unknown patch '{pid}'{did_you_mean(pid, known)}",
                    hint="`primus patches list` shows every patch",
                )


def parse_selection(spec: str | list[str] | None, source: str) -> PatchSelection:
    items = spec if isinstance(spec, list) else str(spec or "all").split(",")
    words = [str(w).strip() for w in items if str(w).strip()]
    include: set[str] | None = set()
    exclude: set[str] = set()
    for word in words:
        if word == "all":
            include = None
        elif word == "none":
            include, exclude = set(), set()
            break
        elif word.startswith("-"):
            exclude.add(word[1:])
        elif include is not None:
            include.add(word)
    if include is not None and not include and exclude and "none" not in words:
        include = None  # only exclusions: everything else runs
    if not words:
        include = None
    return PatchSelection(
        source, None if include is None else frozenset(include), frozenset(exclude)
    )


def selection_for(config_select: str | list[str] | None) -> PatchSelection:
    if os.environ.get("PRIMUS_PATCHES") is not None:
        return parse_selection(os.environ["PRIMUS_PATCHES"], "PRIMUS_PATCHES")
    return parse_selection(config_select, "patches.select")
