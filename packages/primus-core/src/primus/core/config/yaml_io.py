"""Reading YAML the Primus way: line numbers for every key, YAML 1.2 floats, `${VAR:default}`.

`lr: 1e-4` is a float here (plain PyYAML reads it as a string), and so is `--lr 1e-4` on the
command line: both go through `parse_scalar`. A plain (unquoted) scalar with `${VAR}` in it is
typed after substitution, as if the value had been written in the file; a quoted one stays a string.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from primus.core.errors import ConfigError, Origin

KeyPath = tuple[str, ...]


class PrimusLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-4` and `1E5` as floats (YAML 1.2)."""


class PrimusDumper(yaml.SafeDumper):
    """SafeDumper that quotes strings PrimusLoader would read back as floats ("1e-4")."""


for _cls in (PrimusLoader, PrimusDumper):
    _cls.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)[eE][-+]?\d+$"),
        list("-+0123456789."),
    )

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


def parse_scalar(text: str) -> Any:
    """Type a string the way YAML would type it in a file (`1e-4` -> float, `[1,2]` -> list)."""
    try:
        return yaml.load(text, Loader=PrimusLoader) if text.strip() else text
    except yaml.YAMLError:
        return text


def interpolate(text: str, where: Origin) -> tuple[str, str | None]:
    """Substitute `${VAR}` / `${VAR:default}`; return the text and the first variable read from env."""
    from_env: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            from_env.append(name)
            return os.environ[name]
        if default is None:
            raise ConfigError(
                f"environment variable {name} is not set and has no default",
                where,
                hint=f"export {name}=... or write ${{{name}:default}}",
            )
        return default

    return _VAR.sub(substitute, text), (from_env[0] if from_env else None)


class _Builder:
    """Turns a composed YAML node tree into plain values plus an origin per mapping key."""

    def __init__(self, loader: PrimusLoader, path: Path) -> None:
        self.loader = loader
        self.file = str(path)
        self.origins: dict[KeyPath, Origin] = {}

    def origin(self, node: yaml.Node) -> Origin:
        return Origin("file", self.file, node.start_mark.line + 1)

    def build(self, node: yaml.Node, keypath: KeyPath | None) -> Any:
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)  # YAML merge keys (<<)
            result: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = str(self.loader.construct_object(key_node, deep=True))
                if key in result:
                    raise ConfigError(f"duplicate key '{key}'", self.origin(key_node))
                sub = None if keypath is None else (*keypath, key)
                value, origin = self.build_with_origin(value_node, sub, self.origin(key_node))
                result[key] = value
                if sub is not None:
                    self.origins[sub] = origin
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.build(item, None) for item in node.value]
        return self.build_with_origin(node, None, self.origin(node))[0]

    def build_with_origin(self, node: yaml.Node, keypath: KeyPath | None, origin: Origin):
        if not isinstance(node, yaml.ScalarNode):
            return self.build(node, keypath), origin
        if "${" not in node.value:
            return self.loader.construct_object(node, deep=True), origin
        text, env_var = interpolate(node.value, origin)
        value = parse_scalar(text) if node.style is None else text
        return value, Origin("env", origin.file, origin.line, env_var) if env_var else origin


def load_yaml_file(path: Path) -> tuple[dict[str, Any], dict[KeyPath, Origin]]:
    """Load one YAML file (no `extends` handling) into a mapping and the origin of every key."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    loader = PrimusLoader(text)
    try:
        node = loader.get_single_node()
        builder = _Builder(loader, path)
        data = builder.build(node, ()) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        last_line = max(1, len(text.splitlines()))
        where = Origin("file", str(path), min(mark.line + 1, last_line) if mark else None)
        raise ConfigError(f"YAML syntax error: {exc.problem or exc.context}", where) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(
            "the top level must be a mapping (key: value)", Origin("file", str(path), 1)
        )
    return data, builder.origins
