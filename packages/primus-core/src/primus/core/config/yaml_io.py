"""Reading YAML the Primus way: line numbers for every key, YAML 1.2 floats, `${VAR:default}`,
and bounds on what reading a config may cost.

`lr: 1e-4` is a float here (plain PyYAML reads it as a string), and so is `--lr 1e-4` on the
command line: both go through `parse_scalar`. A plain (unquoted) scalar with `${VAR}` in it is
typed after substitution, as if the value had been written in the file; a quoted one stays a string.

The bounds, the same for a file, a `${VAR}` value and a command-line override:

- only a regular file of at most `MAX_BYTES` is read: it is stat'ed first, so a FIFO, a device
  or a folder is refused without being opened for reading;
- at most `MAX_VALUES` YAML nodes as written, and values once aliases are expanded;
- only the tags of plain data: null, booleans, integers, floats, strings, lists and mappings;
  dates stay strings (YAML 1.2 has no timestamps), and a value its tag cannot hold (`!!int abc`)
  is an error at its line;
- no NUL character in a key or a value (no path, name or environment variable can hold one).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from primus.core.errors import ConfigError, Origin

KeyPath = tuple[str, ...]

MAX_BYTES = 4 * 2**20  # the largest config file read (an experiment is a few KiB)
MAX_VALUES = 100_000  # YAML nodes a file, a value or an override may hold, or expand to
_CORE = "tag:yaml.org,2002:"
_SCALAR_TAGS = {
    f"{_CORE}null": "null",
    f"{_CORE}bool": "a boolean",
    f"{_CORE}int": "an integer",
    f"{_CORE}float": "a number",
    f"{_CORE}str": "a string",
}


class _TooManyNodes(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class PrimusLoader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-4` and `1E5` as floats (YAML 1.2), reads dates as strings
    and stops composing past MAX_VALUES nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self.nodes += 1
        if self.nodes > MAX_VALUES:  # before PyYAML composes (and scans) any further
            raise _TooManyNodes(self.peek_event().start_mark.line + 1)
        return super().compose_node(parent, index)  # type: ignore[no-untyped-call]


class PrimusDumper(yaml.SafeDumper):
    """SafeDumper that quotes strings PrimusLoader would read back as floats ("1e-4")."""


for _cls in (PrimusLoader, PrimusDumper):
    _cls.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)[eE][-+]?\d+$"),
        list("-+0123456789."),
    )
PrimusLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != f"{_CORE}timestamp"]
    for first, resolvers in PrimusLoader.yaml_implicit_resolvers.items()
}

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([^}]*))?\}")


def parse_scalar(text: str, where: Origin | None = None) -> Any:
    """Type a string the way YAML would type it in a file (`1e-4` -> float, `[1,2]` -> list),
    under the same bounds and tag rules (an error at `where`); text that is not YAML stays a
    string."""
    return _Builder(None, where).parse(text)


def interpolate(text: str, where: Origin) -> tuple[str, str | None]:
    """Substitute `${VAR}` / `${VAR:default}`; return the text and the first variable read from
    env. A `${` that starts neither (`${BAD`, `${:x}`, one nested in a default) is an error."""
    if "${" in _VAR.sub("", text) or any("${" in (m.group(2) or "") for m in _VAR.finditer(text)):
        raise ConfigError(
            f"malformed ${{...}} in {_shown(text)}: write ${{NAME}} or ${{NAME:default}} (NAME: "
            "letters, digits and _; a default holds no ${...})",
            where,
            hint="close each ${ with }, name a variable after it",
        )
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


def _check_text(text: str, origin: Origin | None) -> str:
    """`text`, unless it holds a NUL or a lone surrogate (no path, name or variable can)."""
    if "\0" in text:
        raise ConfigError(
            "a NUL character (\\0) in a value: no path, name or variable can hold one", origin
        )
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # "\ud800", or a byte the environment could not decode
        raise ConfigError(f"{text[exc.start]!r} in a value is not a character (a lone "
                          "surrogate): it has no UTF-8", origin) from None  # fmt: skip
    return text


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else f"{text[:40]}...")


class _Builder:
    """Turns a composed YAML node tree into plain values plus an origin per mapping key; every
    error is at the node's line in `file`, or at `at` (a command-line token, an env value).
    `${VAR}`s are substituted only where `interpolating` (a file's own scalars): never in a
    value that came from a variable, nor in an override."""

    def __init__(
        self, file: str | None, at: Origin | None = None, interpolating: bool = False
    ) -> None:
        self.file = file
        self.at = at
        self.interpolating = interpolating
        self.origins: dict[KeyPath, Origin] = {}
        self.values = 0
        self.building: set[int] = set()  # the collections being built: an alias to one recurses
        self.last_line = 1

    def origin(self, node: yaml.Node | int) -> Origin:
        if self.at is not None:
            return self.at
        line = node if isinstance(node, int) else node.start_mark.line + 1
        return Origin("file", self.file, min(line, self.last_line))

    def load(self, text: str, keypath: KeyPath | None) -> Any:
        """The one YAML document in `text`, built (None if it holds none). PyYAML's own errors
        pass through; the bounds' are ConfigErrors."""
        self.last_line = max(1, len(text.splitlines()))
        loader = PrimusLoader(text)
        try:
            node = loader.get_single_node()
            return None if node is None else self.build(loader, node, keypath)
        except _TooManyNodes as exc:
            raise ConfigError(
                f"the YAML holds more than {MAX_VALUES} values", self.origin(exc.line)
            ) from None
        except RecursionError:
            where = self.origin(loader.get_mark().line + 1)
            raise ConfigError("the YAML is nested too deeply", where) from None
        finally:
            loader.dispose()

    def parse(self, text: str, count: _Builder | None = None) -> Any:
        """`text` as one YAML value (counted with `count`'s values), or the text itself where
        it is not YAML."""
        if not text.strip():
            return text
        if count is not None:
            self.values = count.values
        try:
            return self.load(text, None)
        except yaml.YAMLError:
            return _check_text(text, self.at)
        finally:
            if count is not None:
                count.values = self.values

    def build(self, loader: PrimusLoader, node: yaml.Node, keypath: KeyPath | None) -> Any:
        self.values += 1
        if self.values > MAX_VALUES:
            raise ConfigError(
                f"the YAML expands to more than {MAX_VALUES} values (aliases that repeat aliases?)",
                self.origin(node),
                hint="write the values out, or use fewer nested aliases (*name)",
            )
        if isinstance(node, yaml.ScalarNode):
            return self.build_with_origin(loader, node, None, self.origin(node))[0]
        if node.tag != _CORE + ("seq" if isinstance(node, yaml.SequenceNode) else "map"):
            raise self.bad_tag(node)
        if id(node) in self.building:
            raise ConfigError("an alias (*name) refers to the list or mapping that holds it",
                              self.origin(node))  # fmt: skip
        self.building.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(loader, node, keypath)
            return [self.build(loader, item, None) for item in node.value]
        finally:
            self.building.discard(id(node))

    def mapping(
        self, loader: PrimusLoader, node: yaml.MappingNode, keypath: KeyPath | None
    ) -> dict[str, Any]:
        loader.flatten_mapping(node)  # YAML merge keys (<<)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError("a key must be a plain value", self.origin(key_node))
            key = str(self.scalar(loader, key_node, self.origin(key_node)))
            if key in result:
                raise ConfigError(f"duplicate key '{key}'", self.origin(key_node))
            sub = None if keypath is None else (*keypath, key)
            value, origin = self.build_with_origin(loader, value_node, sub, self.origin(key_node))
            result[key] = value
            if sub is not None:
                self.origins[sub] = origin
        return result

    def build_with_origin(
        self, loader: PrimusLoader, node: yaml.Node, keypath: KeyPath | None, origin: Origin
    ) -> tuple[Any, Origin]:
        if not isinstance(node, yaml.ScalarNode):
            return self.build(loader, node, keypath), origin
        if "${" not in node.value or not self.interpolating:
            return self.scalar(loader, node, origin), origin
        text, env_var = interpolate(node.value, origin)
        if env_var:
            origin = Origin("env", origin.file, origin.line, env_var)
        if node.tag == f"{_CORE}str" and node.style is None:  # plain: typed after substitution
            return _Builder(self.file, self.at or origin).parse(text, count=self), origin
        substituted = yaml.ScalarNode(node.tag, text, node.start_mark, node.end_mark, node.style)
        return self.scalar(loader, substituted, origin), origin

    def scalar(self, loader: PrimusLoader, node: yaml.ScalarNode, origin: Origin) -> Any:
        """A scalar of one of the plain tags, converted; an error at `origin` otherwise."""
        kind = _SCALAR_TAGS.get(node.tag)
        if kind is None:
            raise self.bad_tag(node, origin)
        _check_text(node.value, origin)
        try:
            return loader.construct_object(node, deep=True)
        except (ValueError, KeyError, OverflowError):  # int('abc'), a 13th month, !!bool maybe
            digits = node.value.lstrip("+-").replace("_", "")
            if kind == "an integer" and digits.isdigit():  # past Python's 4300 digits
                raise ConfigError(f"an integer of {len(digits)} digits is out of range "
                                  "(beyond 64 bits)", origin) from None  # fmt: skip
            raise ConfigError(f"{_shown(node.value)} is not {kind}", origin) from None

    def bad_tag(self, node: yaml.Node, origin: Origin | None = None) -> ConfigError:
        tag = node.tag.replace(_CORE, "!!")
        return ConfigError(
            f"YAML tag {tag} is not allowed: a config holds only null, booleans, integers, "
            "floats, strings, lists and mappings",
            origin or self.origin(node),
            hint="write the value without the tag (a date or binary data as a string)",
        )


_NOT_REGULAR = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _check_file(path: Path, info: os.stat_result, what: str) -> None:
    """A ConfigError unless `info` is a regular file within MAX_BYTES."""
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _NOT_REGULAR if test(info.st_mode)), "not a file")
        raise ConfigError(f"{what} {path} is {kind}, not a regular file",
                          hint=f"name a YAML file (a {what} is read whole)")  # fmt: skip
    if info.st_size > MAX_BYTES:
        raise _too_large(path, what, f"{info.st_size / 2**20:.1f} MiB")


def _too_large(path: Path, what: str, size: str) -> ConfigError:
    return ConfigError(
        f"{what} {path} is {size}, over the limit of {MAX_BYTES // 2**20} MiB",
        hint="an experiment is a few KiB: name data files in it, not their contents",
    )


def read_text(path: Path, what: str = "config file") -> str:
    """The UTF-8 text of `path`, a regular file of at most MAX_BYTES. It is stat'ed before it
    is opened (a FIFO, a device or a folder is refused unopened), opened without blocking and
    checked again, and at most MAX_BYTES + 1 bytes are read (a file that grows, a /proc file)."""
    try:
        _check_file(path, path.stat(), what)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as stream:
            _check_file(path, os.fstat(fd), what)  # what was opened is what was stat'ed
            data = stream.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(f"{what} not found: {path}") from None
    except ValueError:  # os.stat's "embedded null byte"
        raise ConfigError(
            f"cannot read {str(path)!r}: a path cannot hold a NUL character"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise _too_large(path, what, "larger")
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start}",
            Origin("file", str(path), line),
            hint=f"save the file as UTF-8 (a {what} is text)",
        ) from None


def _line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


def load_yaml_file(path: Path) -> tuple[dict[str, Any], dict[KeyPath, Origin]]:
    """Load one YAML file (no `extends` handling) into a mapping and the origin of every key."""
    text = read_text(path)
    last_line = max(1, len(text.splitlines()))
    builder = _Builder(str(path), interpolating=True)
    try:
        data = builder.load(text, ())
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, ...)
        where = Origin("file", str(path), min(_line(text, exc.position), last_line))
        raise ConfigError(
            f"YAML cannot hold character #x{exc.character:04x} (not printable)", where
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = Origin("file", str(path), min(mark.line + 1, last_line) if mark else None)
        raise ConfigError(f"YAML syntax error: {exc.problem or exc.context}", where) from None
    except yaml.YAMLError as exc:  # a reader error found later in the stream
        where = Origin("file", str(path), min(_line(text, getattr(exc, "position", 0)), last_line))
        raise ConfigError(f"YAML error: {exc}", where) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            "the top level must be a mapping (key: value)", Origin("file", str(path), 1)
        )
    return data, builder.origins
