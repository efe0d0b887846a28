"""A module's own sections beside its params (`sft:`, `peft:`, `dpo:`, `data:`): read with
their schema and defaults, each resolved value knowing the line that set it."""

from __future__ import annotations

from typing import Any, Protocol

from primus.core.config.schema import ParamSchema, raise_all
from primus.core.config.tree import ConfigTree, single_value_tree
from primus.core.config.yaml_io import KeyPath
from primus.core.errors import ConfigError, Origin


class Located:
    """A resolved section that knows where each key was set (the section's own line under "")."""

    origins: dict[str, Origin]

    def error(self, key: str, message: str, hint: str | None = None) -> ConfigError:
        """A ConfigError at the line that set `key` (the section's line if it is a default)."""
        return ConfigError(message, self.origins.get(key) or self.origins.get(""), hint)


class Section(Protocol):
    """A resolved section: its values as written back, and their origins."""

    @property
    def written(self) -> dict[str, Any]: ...

    @property
    def origins(self) -> dict[str, Origin]: ...


def read_section(
    exp: ConfigTree, module: KeyPath, name: str, schema: ParamSchema
) -> tuple[dict[str, Any], dict[str, Origin]] | None:
    """The section `name` of a module, type-checked, with defaults (a key set to null takes
    its default); None when absent."""
    if name not in (exp.get(module) or {}):
        return None
    path = (*module, name)
    data = exp.get(path)
    if not isinstance(data, dict):
        raise ConfigError(f"'{name}' must be a mapping", exp.origin(path))
    n = len(module)
    origins = {
        k[n:]: o for k, o in exp.origins.items() if k[:n] == module and k[n : n + 1] == (name,)
    }
    raise_all(schema.check(ConfigTree({name: data}, origins), what=f"{name} key"))
    defaults = {key.split(".", 1)[1]: spec.default for key, spec in schema.specs.items()}
    where = {".".join(k[1:]): o for k, o in origins.items() if len(k) >= 2}  # columns.prompt
    where[""] = exp.origin(path) or Origin("default")
    return defaults | {k: v for k, v in data.items() if v is not None}, where  # null: default


def section_tree(prefix: KeyPath, name: str, section: Section) -> ConfigTree:
    """A resolved section as the tree `name:` under `prefix`, each key with its origin (for
    the resolved experiment)."""
    tree = ConfigTree()
    for key, value in section.written.items():
        where = section.origins.get(key) or Origin("default")
        tree.merge(single_value_tree((*prefix, name, key), value, where))
    return tree
