"""Runs the bad-input corpus of `primus.testing.fuzz` in this process: each case as `config
validate` (the fast path: the cached schema and the adapter's `check_params`, no upstream) and
as `train --dry-run` (the full path: the upstream's own validation, the patches applied),
through `primus.cli.main.main` (the upstream is imported once), with what each outcome breaks
of the promise (exit 2, one `error:` message at the file and line at fault, no traceback,
bounded time, and the two paths giving the same verdict and message)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from primus.core.config.sanity import Rule
from primus.testing.fuzz import EXPERIMENT, Case, Pairs, corpus

LIMIT_S = 10.0  # the most one case may take (the first pays for the upstream's import)


@dataclass
class Outcome:
    """What one command gave: exit code, stderr, seconds, stdout."""

    code: int
    stderr: str
    seconds: float
    stdout: str = ""

    @property
    def message(self) -> str:
        """The `error:` message (its first line onwards), or ''."""
        start = self.stderr.find("error: ")
        return self.stderr[start:] if start >= 0 else ""

    def problems(self, case: Case) -> list[str]:
        """How this outcome breaks the promise for `case` (empty when it keeps it)."""
        found = []
        if self.code != 2:
            found.append(f"exit {self.code}, not 2")
        if "Traceback" in self.stderr:
            found.append("a traceback")
        if len(re.findall(r"^error: ", self.stderr, re.M)) != 1:
            found.append("not exactly one 'error:' message")
        elif not re.search(case.at, self.message):
            found.append(f"the message does not match {case.at!r}")
        if self.seconds > LIMIT_S:
            found.append(f"{self.seconds:.1f} s, over {LIMIT_S} s")
        return found


def command_lines(case: Case, folder: Path) -> dict[str, list[str]]:
    """The two commands that must agree on `case`: validate and a dry run."""
    exp = str(folder / EXPERIMENT)
    return {
        "validate": ["config", "validate", exp, *case.overrides],
        "dry-run": ["train", "pretrain", "--config", exp, "--dry-run", "--full", *case.overrides],
    }


def write_case(case: Case, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    for name in case.fifos:
        if not (folder / name).exists():
            os.mkfifo(folder / name)


def run_in_process(argv: list[str], folder: Path, env: dict[str, str | None]) -> Outcome:
    """`primus ARGV` through `primus.cli.main.main`, in `folder`, with `env` applied, stdout
    and stderr captured; the environment, the working directory, the CLI's debug switch and
    every patched upstream name are put back afterwards. A command that shields this process's
    helper processes (a training run outside `in_process`) fails here: the shield cannot be
    undone, and every process this one forks later would ignore the stop signals."""
    from primus.cli.common import DEBUG
    from primus.cli.main import main
    from primus.core.launch import helper_processes
    from primus.core.patches import restore_all

    shielded_before = helper_processes.shielded()

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.pop("PRIMUS_PATCHES", None)
    os.environ["PRIMUS_WORKSPACE"] = str(folder / "ws")
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    err, out = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    code: int | str | None = 0
    try:
        os.chdir(folder)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                main(argv)
            except SystemExit as exc:
                code = exc.code
            except BaseException:  # what the CLI would show: a traceback
                import traceback

                traceback.print_exc(file=err)
                code = 1
    finally:
        seconds = time.perf_counter() - start
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        DEBUG.on = False
        restore_all()
    assert shielded_before or not helper_processes.shielded(), (
        f"primus {' '.join(argv)} shielded the test process's helper processes: run it within "
        "primus.testing.in_process.in_process()"
    )
    return Outcome(code if isinstance(code, int) else 1, err.getvalue(), seconds, out.getvalue())


def run_case(case: Case, folder: Path) -> tuple[list[str], dict[str, Outcome]]:
    """Run `case` as validate and as a dry run, in this process; what breaks the promise."""
    write_case(case, folder)
    outcomes = {
        what: run_in_process(argv, folder, case.env)
        for what, argv in command_lines(case, folder).items()
    }
    problems = [f"{what}: {p}" for what, o in outcomes.items() for p in o.problems(case)]
    validate, dry_run = outcomes["validate"].message, outcomes["dry-run"].message
    if validate != dry_run:
        problems.append(f"validate and dry-run differ:\n  {validate}\n  {dry_run}")
    return problems, outcomes


@dataclass
class Report:
    """A corpus run: cases, the seconds it took, and each failing case with its problems."""

    cases: int
    seconds: float
    failures: dict[str, list[str]]

    def __str__(self) -> str:
        lines = [f"{self.cases} cases in {self.seconds:.1f} s, {len(self.failures)} failing"]
        lines += [f"  {name}: {'; '.join(p)}" for name, p in self.failures.items()]
        return "\n".join(lines)


def check_corpus(cases: list[Case], recipe: Path, folder: Path) -> Report:
    """Run every case in this process after a warm-up that validates the unmutated `recipe`
    in full (it must pass, writing nothing: the corpus's failures are the mutations'), which
    imports the upstream."""
    folder.mkdir(parents=True, exist_ok=True)
    warm = run_in_process(["config", "validate", "--full", str(recipe)], folder, {})
    assert warm.code == 0, f"the recipe itself does not validate:\n{warm.stderr[-3000:]}"
    assert not any(folder.iterdir()), "validate wrote into the workspace"
    start = time.perf_counter()
    failures = {}
    for i, case in enumerate(cases):
        problems, _ = run_case(case, folder / f"case-{i}")
        if problems:
            failures[case.name] = problems
    return Report(len(cases), time.perf_counter() - start, failures)


def check_backend(
    recipe: Path,
    sizes: list[str],
    refusals: dict[str, tuple[str, Pairs]],
    folder: Path,
    rules: Mapping[str, Rule] | None = None,
    extra: dict[str, Pairs] | None = None,
) -> Report:
    """A backend's corpus: `recipe` mutated (its `sizes` keys too, its sanity `rules`' keys,
    the model-build `refusals`' params and the `extra` combinations it must refuse), at least
    300 cases, checked by `check_corpus`."""
    combinations = {name: pairs for name, (_, pairs) in refusals.items()} | (extra or {})
    cases = corpus(recipe, sizes, combinations, rules=rules)
    assert len(cases) >= 300, f"only {len(cases)} cases"
    return check_corpus(cases, recipe, folder)


def refusal_problems(
    recipe: Path, refusals: dict[str, tuple[str, Pairs]], folder: Path
) -> list[str]:
    """Combinations an upstream refuses only when it builds the model (name -> (the key the
    error must name, the params)): how validate fails to refuse one with that key and a hint
    that sets it."""
    found = []
    extra = {name: pairs for name, (_, pairs) in refusals.items()}
    for case in (c for c in corpus(recipe, [], extra) if c.name in refusals):
        problems, outcomes = run_case(case, folder / re.sub(r"\W", "_", case.name))
        key = re.escape(refusals[case.name][0])
        message = outcomes["validate"].message
        if not re.search(rf"{key}.*\n  hint: .*set {key}", message, re.S):
            problems.append(f"no key {key} and fix in: {message}")
        found += [f"{case.name}: {p}" for p in problems]
    return found


def inputs_checked(recipe: Path, *overrides: str) -> None:
    """`config validate`'s check of the files the recipe's first module reads, with
    `overrides` (the framework is not imported)."""
    from primus.core.runtime.resolution import backend_for, load

    module = next(iter(load(recipe, list(overrides)).modules.values()))
    backend_for(module, inputs=True)


def assert_inputs_refused(recipe: Path, cases: list[tuple[tuple[str, ...], str, str]]) -> None:
    """Each case (overrides, what the error says, what its hint says) is a ConfigError of
    `inputs_checked` pointing at the first override's token."""
    import pytest

    from primus.core.errors import ConfigError

    for overrides, said, hint in cases:
        with pytest.raises(ConfigError, match=re.escape(said)) as raised:
            inputs_checked(recipe, *overrides)
        assert f"cli ({overrides[0]})" in str(raised.value.origin), raised.value
        assert hint in str(raised.value.hint), raised.value.hint
