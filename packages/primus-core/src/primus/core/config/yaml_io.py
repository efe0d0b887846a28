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


MAX_VALUES = 100_000  # values one file may expand to: aliases can multiply a short file


class _Builder:
    """Turns a composed YAML node tree into plain values plus an origin per mapping key."""

    def __init__(self, loader: PrimusLoader, path: Path) -> None:
        self.loader = loader
        self.file = str(path)
        self.origins: dict[KeyPath, Origin] = {}
        self.values = 0

    def origin(self, node: yaml.Node) -> Origin:
        return Origin("file", self.file, node.start_mark.line + 1)

    def build(self, node: yaml.Node, keypath: KeyPath | None) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise ConfigError(
                f"the file expands to more than {MAX_VALUES} values (aliases that repeat aliases?)",
                self.origin(node),
                hint="write the values out, or use fewer nested aliases (*name)",
            )
        if isinstance(node, yaml.MappingNode):
            self.loader.flatten_mapping(node)  # YAML merge keys (<<)
            result: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    raise ConfigError("a key must be a plain value", self.origin(key_node))
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


def _line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}",
            Origin("file", str(path), line),
            hint="save the file as UTF-8 (a YAML experiment is text)",
        ) from None


def load_yaml_file(path: Path) -> tuple[dict[str, Any], dict[KeyPath, Origin]]:
    """Load one YAML file (no `extends` handling) into a mapping and the origin of every key."""
    text = _read(path)
    last_line = max(1, len(text.splitlines()))
    try:
        loader = PrimusLoader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, ...)
        where = Origin("file", str(path), min(_line(text, exc.position), last_line))
        raise ConfigError(
            f"YAML cannot hold character #x{exc.character:04x} (not printable)", where
        ) from None
    try:
        node = loader.get_single_node()
        builder = _Builder(loader, path)
        data = builder.build(node, ()) if node is not None else {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Origin("file", str(path), min(mark.line + 1, last_line) if mark else None)
        raise ConfigError(f"YAML syntax error: {exc.problem or exc.context}", where) from None
    except yaml.YAMLError as exc:  # a reader error found later in the stream
        where = Origin("file", str(path), min(_line(text, getattr(exc, "position", 0)), last_line))
        raise ConfigError(f"YAML error: {exc}", where) from None
    except RecursionError:
        where = Origin("file", str(path), min(loader.get_mark().line + 1, last_line))
        raise ConfigError("the YAML is nested too deeply", where) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(
            "the top level must be a mapping (key: value)", Origin("file", str(path), 1)
        )
    return data, builder.origins
