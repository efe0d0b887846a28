"""Loading a config file with its `extends` chain into one ConfigTree."""

from __future__ import annotations

from pathlib import Path

from primus.core.config.tree import ConfigTree
from primus.core.config.yaml_io import load_yaml_file
from primus.core.errors import ConfigError, Origin


def load_config_file(
    path: Path, referenced_at: Origin | None = None, _chain: tuple[Path, ...] = ()
) -> ConfigTree:
    """Load `path`, merging the files it `extends` (left to right) under its own keys.

    `extends` is one path or a list of paths, each relative to the file that names it.
    """
    try:
        path = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: RuntimeError before Python 3.13
        raise ConfigError(f"{path}: a symbolic link that loops", referenced_at,
                          hint="point the link at a file") from None  # fmt: skip
    if path in _chain:
        cycle = " -> ".join(p.name for p in (*_chain[_chain.index(path) :], path))
        raise ConfigError(f"extends cycle: {cycle}", referenced_at)
    try:
        data, origins = load_yaml_file(path)
    except ConfigError as exc:
        if exc.origin is None and referenced_at is not None:
            exc.origin = referenced_at
        raise
    own = ConfigTree(data, origins)
    own.files = [str(path)]
    extends_origin = own.origin(("extends",))
    bases = own.pop("extends")
    if bases is None:
        return own
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) and b for b in bases):
        raise ConfigError("'extends' must be a path or a list of paths", extends_origin)
    tree = ConfigTree()
    for base in bases:
        tree.merge(load_config_file(path.parent / base, extends_origin, (*_chain, path)))
    tree.merge(own)
    return tree
