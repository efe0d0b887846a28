"""A config mapping that remembers, for every key, where its value came from and what it replaced."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from primus.core.config.yaml_io import KeyPath
from primus.core.errors import Origin

Replaced = list[tuple[Any, Origin]]


class ConfigTree:
    """Nested dicts plus `origins[keypath]` and `replaced[keypath]` (older values, oldest first).

    Merging is the only way values change, and every change that hides an older value is
    recorded: there are no silent merges. Lists and scalars replace; mappings merge key by key.
    `files`: the config files merged in, oldest layer first (a file merged again moves last),
    so that values set in two files can be told apart by which layer came later.
    """

    def __init__(
        self, data: dict[str, Any] | None = None, origins: dict[KeyPath, Origin] | None = None
    ) -> None:
        self.data: dict[str, Any] = data if data is not None else {}
        self.origins: dict[KeyPath, Origin] = origins if origins is not None else {}
        self.replaced: dict[KeyPath, Replaced] = {}
        self.files: list[str] = []

    def merge(self, other: ConfigTree) -> None:
        """Lay `other` over this tree."""
        self._merge_into(self.data, other, ())
        self.files = [f for f in self.files if f not in other.files] + other.files

    def layer(self, origin: Origin | None) -> int:
        """How late the layer that set a value at `origin` was merged: a default -1, a file
        its place in `files`, anything else (the command line) after every file."""
        if origin is None or origin.kind == "default":
            return -1
        return self.files.index(origin.file) if origin.file in self.files else len(self.files)

    def _merge_into(self, target: dict[str, Any], other: ConfigTree, prefix: KeyPath) -> None:
        source = other.get(prefix) if prefix else other.data
        for key, value in source.items():
            path = (*prefix, key)
            old = target.get(key)
            if isinstance(old, dict) and isinstance(value, dict):
                self.origins.setdefault(path, other.origins.get(path, Origin("default")))
                self._merge_into(old, other, path)
                continue
            history = self.replaced.get(path, [])
            if key in target:
                history = [*history, (old, self.origins.get(path, Origin("default")))]
                self._forget_below(path)
            target[key] = copy.deepcopy(value)
            for sub, origin in other.origins.items():
                if sub[: len(path)] == path:
                    self.origins[sub] = origin
            for sub, older in other.replaced.items():
                if sub[: len(path)] == path:
                    self.replaced[sub] = [*(history if sub == path else []), *older]
            if history:
                self.replaced[path] = history + other.replaced.get(path, [])

    def _forget_below(self, path: KeyPath) -> None:
        for table in (self.origins, self.replaced):
            for sub in [k for k in table if len(k) > len(path) and k[: len(path)] == path]:
                del table[sub]

    def get(self, path: KeyPath, default: Any = None) -> Any:
        node: Any = self.data
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    def subtree(self, path: KeyPath) -> ConfigTree:
        """The mapping at `path` as a tree of its own (keys re-rooted), or an empty tree."""
        data = self.get(path)
        n = len(path)
        tree = ConfigTree(copy.deepcopy(data) if isinstance(data, dict) else {})
        tree.origins = {k[n:]: o for k, o in self.origins.items() if len(k) > n and k[:n] == path}
        tree.replaced = {k[n:]: r for k, r in self.replaced.items() if len(k) > n and k[:n] == path}
        return tree

    def pop(self, key: str) -> Any:
        """Remove a top-level key with its provenance; return its value (None if absent)."""
        self._forget_below((key,))
        self.origins.pop((key,), None)
        self.replaced.pop((key,), None)
        return self.data.pop(key, None)

    def leaves(self) -> Iterator[tuple[KeyPath, Any]]:
        """Every non-mapping value with its key path, in document order."""

        def walk(node: dict[str, Any], prefix: KeyPath) -> Iterator[tuple[KeyPath, Any]]:
            for key, value in node.items():
                if isinstance(value, dict) and value:
                    yield from walk(value, (*prefix, key))
                else:
                    yield (*prefix, key), value

        return walk(self.data, ())

    def origin(self, path: KeyPath) -> Origin | None:
        return self.origins.get(path)


def single_value_tree(path: KeyPath, value: Any, origin: Origin) -> ConfigTree:
    """A tree holding one value at `path` (used for CLI overrides)."""
    data: dict[str, Any] = {}
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    origins = {path[:i]: origin for i in range(1, len(path) + 1)}

    def nested(node: Any, prefix: KeyPath) -> None:
        if isinstance(node, dict):
            for key, sub in node.items():
                origins[(*prefix, key)] = origin
                nested(sub, (*prefix, key))

    nested(value, path)
    return ConfigTree(data, origins)
