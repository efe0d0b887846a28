"""A deterministic corpus of bad experiments, mutated from a backend's recipe: every case must
fail as bad config (exit 2, one `error:` message, no traceback, the file and line at fault), in
bounded time, and `config validate` (no upstream imported) must agree with `train --dry-run`.

A test builds the corpus with `corpus(recipe, ...)` and runs each case with
`primus.testing.fuzz_runs.run_case`, in this process (the upstream is imported once);
its `Outcome.problems` lists what is wrong.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from primus.core.config.sanity import Rule
from primus.core.config.yaml_io import MAX_BYTES

EXPERIMENT = "exp.yaml"
_FILE_LINE = r"{name}:\d+"
_LIST: dict[str, str | None] = {"FUZZ_LIST": "[1, 2]"}
_ANY_FILE_LINE = r"[\w.-]+\.yaml:\d+"

KeyPath = tuple[str, ...]
Pairs = list[tuple[str, Any]]  # (dotted param, value) set together under the module's overrides


@dataclass(frozen=True)
class Case:
    """One bad input: files to write (name -> bytes), overrides, environment changes (None
    unsets), a regex the error message must match (the file:line or the token at fault), and
    names to create as FIFOs (named pipes: a read would block)."""

    name: str
    files: dict[str, bytes]
    overrides: tuple[str, ...] = ()
    env: dict[str, str | None] = field(default_factory=dict)
    at: str = _FILE_LINE.format(name=re.escape(EXPERIMENT))
    fifos: tuple[str, ...] = ()


def _dump(tree: dict[str, Any]) -> bytes:
    return yaml.safe_dump(tree, sort_keys=False).encode()


def _paths(node: Any, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """Every key path of a mapping tree with its value, parents before children."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key), value
            yield from _paths(value, (*prefix, key))


def _with(tree: dict[str, Any], path: KeyPath, value: Any) -> dict[str, Any]:
    """A deep copy of `tree` with `path` set to `value`."""
    copy = yaml.safe_load(yaml.safe_dump(tree))
    node = copy
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    return copy


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _wrong_types(value: Any) -> list[Any]:
    """Values of the wrong type for a key that holds `value`."""
    if isinstance(value, dict):
        return [7, [1, 2], "fuzz"]
    wrong: list[Any] = [{"fuzz": 1}, [[1, 2]]]
    if _is_number(value) or isinstance(value, bool):
        wrong.append("fuzz-not-a-value")
    if _is_number(value):
        wrong.append(True)
    return wrong


def _misspell(key: str, rng: random.Random) -> str:
    i = rng.randrange(len(key))
    return key[:i] + key[i + 1 :] + "x" if len(key) > 3 else key + "_fuzz"


def _file_cases(tree: dict[str, Any], recipe: Path) -> list[Case]:
    """Unreadable and malformed files: empty, binary, non-UTF-8, bombs, syntax, extends."""
    good = _dump(tree)
    bomb = b"a: &a [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n".encode()
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    bombs = {
        "alias bomb": bomb,
        "alias bomb in a key": bomb + b"modules: {pre_trainer: {overrides: {fuzz: *i}}}\n",
        "deep nesting": b"modules: " + b"[" * 2000 + b"]" * 2000 + b"\n",
        "deep mapping nesting": b"modules: " + b"{a: " * 2000 + b"1" + b"}" * 2000 + b"\n",
    }
    files = {
        "empty file": b"",
        "only a comment": b"# nothing\n",
        "a scalar document": b"42\n",
        "a list document": b"- 1\n- 2\n",
        "binary": bytes(range(256)) * 4,
        "NUL bytes": good[:40] + b"\x00\x00" + good[40:],
        "non-UTF-8 (latin-1)": good + "exp_name: caf\xe9\n".encode("latin-1"),
        "UTF-16": good.decode().encode("utf-16"),
        "truncated": good[: len(good) // 2] + b"\n  - [",
        "tab indentation": good.replace(b"  ", b"\t", 1),
        "unclosed quote": good + b'exp_name: "unclosed\n',
        "two documents": good + b"---\n" + good,
        "bad tag": good + b"exp_name: !!python/object:os.system x\n",
        "unknown tag": good + b"exp_name: !fuzz x\n",
        "duplicate top key": good + b"workspace: again\n",
        "duplicate module key": good.replace(b"framework:", b"framework: x\n    framework:", 1),
        "undefined alias": good + b"exp_name: *nowhere\n",
        "unset env var": good.replace(b"workspace: ws", b"workspace: ${FUZZ_UNSET_VAR}", 1),
        "unset env var in a param": good.replace(
            b"overrides:", b"overrides:\n      fuzz_env: ${FUZZ_UNSET_VAR}", 1
        ),
        "bad env interpolation": good.replace(b"workspace: ws", b"workspace: [${1BAD}x}", 1),
        **bombs,
        **_tag_cases(tree),
    }
    cases = [Case(name, {EXPERIMENT: text}) for name, text in files.items()]
    parent = {**tree, "extends": "base.yaml"}
    extends = {
        "extends a missing file": ({}, "nope.yaml"),
        "extends a folder": ({}, "."),
        "extends itself": ({}, EXPERIMENT),
        "extends a number": ({}, 3),
        "extends a mapping": ({}, {"a": 1}),
        "extends a list with a number": ({}, [str(recipe), 3]),
        "extends a binary file": ({"base.yaml": bytes(range(256))}, "base.yaml"),
        "extends a cycle": ({"base.yaml": b"extends: exp.yaml\n"}, "base.yaml"),
        "extends a broken file": ({"base.yaml": b"a: [\n"}, "base.yaml"),
        "extends an empty name": ({}, ""),
        "extends a NUL in its path": ({}, "base\0.yaml"),
        "extends a device": ({}, "/dev/zero"),
        "extends a file over the size limit": ({"base.yaml": b"#" * (MAX_BYTES + 1)}, "base.yaml"),
        "extends a FIFO": ({}, "fifo.yaml"),
    }
    for name, (extra, target) in extends.items():
        at = "base.yaml" if "base.yaml" in extra and "cycle" not in name else EXPERIMENT
        text = _dump({**parent, "extends": target})
        fifos = ("fifo.yaml",) if target == "fifo.yaml" else ()
        cases.append(
            Case(name, {EXPERIMENT: text, **extra}, at=re.escape(at) + r"(:\d+)?", fifos=fifos)
        )
    for name, value in (("a preset", "fuzz_no_such_preset"), ("a model", "no_such_model")):
        key = "config" if name == "a preset" else "model"
        bad = _with(tree, ("modules", "pre_trainer", key), value)
        cases.append(Case(f"missing {name}", {EXPERIMENT: _dump(bad)}))
    cases.append(Case("missing experiment file", {}, at=re.escape(EXPERIMENT)))
    cases.append(
        Case("the experiment is a FIFO", {}, at=re.escape(EXPERIMENT), fifos=(EXPERIMENT,))
    )
    return cases


def _raw(tree: dict[str, Any], key: str, raw: str) -> bytes:
    """`tree` with top-level `key` written as the YAML text `raw` (a tag, an escape)."""
    return _dump({k: v for k, v in tree.items() if k != key}) + f"{key}: {raw}\n".encode()


def _tag_cases(tree: dict[str, Any]) -> dict[str, bytes]:
    """Tags no config value may carry, values their tag cannot hold, and characters no value
    may hold (a NUL, a lone surrogate), written as YAML escapes."""
    raw = {
        "!!int that is not one": "!!int abc",
        "!!float that is not one": "!!float ...",
        "!!timestamp of no date": "!!timestamp 2020-99-99",
        "!!bool that is not one": "!!bool maybe",
        "!!binary": "!!binary aGVsbG8=",
        "!!set": "!!set {a, b}",
        "an integer of 5000 digits": "1" * 5000,
        "an alias inside itself": "&a [*a]",
        "a NUL in a name": '"fuzz\\0"',
        "a lone surrogate in a name": '"fuzz\\ud800"',
    }
    cases = {name: _raw(tree, "exp_name", text) for name, text in raw.items()}
    cases["a NUL in an env value"] = _raw(tree, "env", '{FUZZ: "a\\0b"}')
    cases["a tagged key"] = _raw(tree, "env", "{!!binary aGk=: 1}")
    return cases


def _run_dir_cases(tree: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Names that would put the run directory outside the workspace, or nowhere."""
    bad: dict[str, list[str | None]] = {
        "exp_name": ["../../../../tmp/escape", "/tmp/escape", "", "..", "x" * 300, "a\nb", " "],
        "work_group": ["a/b", "."],
        "user_name": ["..", "/abs"],
        "workspace": ["", None],
    }
    return [(f"{key} = {v!r:.30}", _with(tree, (key,), v)) for key, vs in bad.items() for v in vs]


def _override_cases(good: bytes, leaves: list[KeyPath]) -> list[Case]:
    """Malformed and bad command-line overrides (the token at fault is named)."""
    tokens = [
        "=5", "..=1", "a..b=1", "lr", "-x", "---=1", ".fuzz=1", "fuzz.=1",
        "fuzz_unknown=1", "--fuzz-unknown", "--fuzz_unknown=3", "modules=3",
        "modules.pre_trainer=3", "modules.pre_trainer.framework=nope", "exp_name=[1, 2]",
        "log_level=LOUD", "log_level=[1]", "patches.select=3", "patches.on_error=maybe",
        "patches.select=no_such_patch", "env=3", "workspace={a: 1}", "init_from.hf=/nope",
        "sft=3", "peft=[1]", "exp_name=..", "user_name=a/b", "work_group=/tmp",
        "exp_name=!!int abc", "exp_name=!!timestamp 2020-99-99", "fuzz=&a [*a]",
        'exp_name="a\\0b"',
    ]  # fmt: skip
    for path in leaves:
        dotted = ".".join(path)
        tokens += [f"{dotted}={v}" for v in ("[1, [2]]", "{fuzz: 1}", "fuzz-not-a-value")]
    return [Case(f"override {t!r}", {EXPERIMENT: good}, (t,), at=re.escape(t)) for t in tokens]


def corpus(
    recipe: Path,
    sizes: list[str],
    extra: dict[str, Pairs] | None = None,
    seed: int = 0,
    rules: Mapping[str, Rule] | None = None,
) -> list[Case]:
    """The bad experiments for one backend, mutated from `recipe` (its tiny CPU experiment).

    `sizes` are the dotted param keys (under the module's overrides) that hold sizes: each
    gets 0, a negative and a huge value. `extra` adds named combinations (name -> [(dotted
    param, value)]) that the backend must reject. `rules` are the backend's sanity rules
    (`primus.core.config.sanity`): each key not in `sizes` gets each value its rule refuses.
    Deterministic for a given `seed`.
    """
    rng = random.Random(seed)
    tree = yaml.safe_load(recipe.read_text())
    tree["workspace"] = "ws"
    module = next(iter(tree["modules"]))
    params: KeyPath = ("modules", module, "overrides")
    cases = _file_cases(tree, recipe)

    def case(name: str, bad: dict[str, Any], at: str | None = None) -> Case:
        return Case(name, {EXPERIMENT: _dump(bad)}, at=at or Case.at)

    for path, value in _paths(tree):
        dotted = ".".join(path)
        if path[0] == "env":  # free names, any scalar value: only a mapping or a list is bad
            if len(path) > 1:
                cases += [case(f"{dotted} = {w!r}", _with(tree, path, w)) for w in ({"a": 1}, [1])]
            continue
        for wrong in _wrong_types(value):
            cases.append(case(f"{dotted} = {wrong!r}", _with(tree, path, wrong)))
        if isinstance(value, dict):
            cases.append(case(f"{dotted}: unknown key", _with(tree, (*path, "fuzz_key"), 1)))
            cases.append(case(f"{dotted}: null key", _with(tree, (*path, None), 1)))  # type: ignore[arg-type]
        if path[:-1] != ("modules",):  # a module's name is free
            misspelled = (*path[:-1], _misspell(path[-1], rng))
            cases.append(case(f"{dotted} misspelled", _with(_drop(tree, path), misspelled, value)))
    cases.append(case("no modules", _with(tree, ("modules",), {})))
    cases.append(case("env name with '='", _with(tree, ("env",), {"A=B": 1})))
    cases.append(case("env value a list", _with(tree, ("env",), {"FUZZ": [1]})))
    cases.append(case("module without framework", _drop(tree, ("modules", module, "framework"))))
    cases.append(case("unknown framework", _with(tree, ("modules", module, "framework"), "fuzz")))
    cases.append(case("a second module", _with(tree, ("modules", "fuzz"), {"framework": 3})))
    cases += [case(name, bad) for name, bad in _run_dir_cases(tree)]
    for key, rule in (rules or {}).items():
        for value in rule.refuses if key not in sizes else ():
            assert rule.problem(key, value), f"{key}: its rule does not refuse {value!r}"
            cases.append(
                case(f"{key} = {value!r:.20}", _with(tree, (*params, *key.split(".")), value))
            )
    for key in sizes:
        path = (*params, *key.split("."))
        for value in (0, -1, -(2**31), 2**64, 10**400, -(10**30), "fuzz", [1]):
            cases.append(case(f"{key} = {value!r:.20}", _with(tree, path, value)))
        for value in (0, -5):
            token = f"{key}={value}"
            cases.append(Case(f"override {token}", {EXPERIMENT: _dump(tree)}, (token,), at=token))
    for keypath, value in _paths(tree[params[0]][module][params[2]]):
        if isinstance(value, float) and not isinstance(value, bool):
            for number in (float("inf"), float("-inf"), float("nan")):
                dotted = ".".join(keypath)
                cases.append(case(f"{dotted} = {number}", _with(tree, (*params, *keypath), number)))
    for name, pairs in (extra or {}).items():
        mutated = tree
        for dotted, value in pairs:
            mutated = _with(mutated, (*params, *dotted.split(".")), value)
        cases.append(case(name, mutated, at=_ANY_FILE_LINE))  # the key at fault may be a preset's
    leaves = [p for p, v in _paths(tree[params[0]][module][params[2]]) if not isinstance(v, dict)]
    leaves += [tuple(k.split(".")) for k in sizes if tuple(k.split(".")) not in leaves]
    cases += _override_cases(_dump(tree), leaves)
    listed = _with(tree, ("workspace",), "${FUZZ_LIST}")
    cases.append(Case("workspace from an env list", {EXPERIMENT: _dump(listed)}, env=_LIST))
    for name, value in (("a tag", "!!int abc"), ("a path", "../../escape")):
        named = _dump(_with(tree, ("exp_name",), "${FUZZ_VALUE}"))
        cases.append(Case(f"exp_name from an env value with {name}", {EXPERIMENT: named},
                          env={"FUZZ_VALUE": value}))  # fmt: skip
    for leaf in leaves[:8]:
        from_env = _with(tree, (*params, *leaf), "${FUZZ_BAD_VALUE}")
        cases.append(
            Case(f"{'.'.join(leaf)} from a bad env value", {EXPERIMENT: _dump(from_env)},
                 env={"FUZZ_BAD_VALUE": "{fuzz: [1"}),
        )  # fmt: skip
    return cases


def _drop(tree: dict[str, Any], path: KeyPath) -> dict[str, Any]:
    copy = _with(tree, path, None)
    node = copy
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return copy
