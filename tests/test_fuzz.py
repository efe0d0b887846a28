"""Bad input in core, through the dummy backend: bad files and overrides are one config error
(exit 2, file:line, no traceback) in bounded time, in-process and as real `primus` processes;
`config validate` (no framework imported) gives the verdict of `train --dry-run` (the upstream
imported, the patches applied), and writes nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from primus.testing.fuzz import EXPERIMENT, corpus
from primus.testing.fuzz_runs import Outcome, check_corpus, write_case
from primus.testing.runs import primus

DUMMY = Path(__file__).resolve().parent / "fixtures" / "dummy-quickstart.yaml"
CASES = {c.name: c for c in corpus(DUMMY, [])}


def test_the_core_corpus_through_the_dummy_backend(tmp_path) -> None:
    report = check_corpus(list(CASES.values()), DUMMY, tmp_path)
    print(f"\ndummy fuzz: {report}")
    assert report.cases >= 100 and not report.failures, str(report)


@pytest.mark.parametrize("name", ["alias bomb", "binary", "NUL bytes", "deep nesting"])
def test_bad_files_as_real_processes(tmp_path, name) -> None:
    case = CASES[name]
    write_case(case, tmp_path)
    messages = []
    for argv in (["config", "validate", EXPERIMENT], ["train", "pretrain", "-c", EXPERIMENT, "--dry-run"]):  # fmt: skip
        result = primus(*argv, cwd=tmp_path, PRIMUS_WORKSPACE=str(tmp_path / "ws"))
        outcome = Outcome(result.returncode, result.stderr, 0.0)
        assert outcome.problems(case) == [], result.stderr
        messages.append(outcome.message)
    assert messages[0] == messages[1] and re.match(r"error: exp\.yaml:\d+: ", messages[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == [EXPERIMENT]


def test_a_fifo_as_the_experiment_is_refused_unopened_as_real_processes(tmp_path) -> None:
    """`--config` naming a FIFO: refused from its stat, not read (a read would block forever)."""
    case = CASES["the experiment is a FIFO"]
    write_case(case, tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PRIMUS_PATCHES"}
    for argv in (["config", "validate", "-c", EXPERIMENT], ["train", "pretrain", "-c", EXPERIMENT, "--dry-run"]):  # fmt: skip
        start = time.perf_counter()
        result = subprocess.run([sys.executable, "-m", "primus.cli", *argv], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)  # fmt: skip
        outcome = Outcome(result.returncode, result.stderr, time.perf_counter() - start)
        assert outcome.problems(case) == [], result.stderr
        assert "is a FIFO (named pipe), not a regular file" in outcome.message


def test_validate_checks_what_a_dry_run_checks_and_writes_nothing(tmp_path) -> None:
    ws = f"workspace={tmp_path / 'ws'}"
    fast = primus("config", "validate", str(DUMMY), ws, cwd=tmp_path)
    full = primus("config", "validate", "--full", str(DUMMY), ws, cwd=tmp_path)
    for valid in (fast, full):
        assert valid.returncode == 0, valid.stderr
        assert valid.stdout.splitlines() == ["ok: module 'pre_trainer' (dummy): 7 params", f"{DUMMY}: valid"]  # fmt: skip
    assert "lifecycle: convert_config" not in fast.stderr  # no upstream needed
    assert "[dummy] lifecycle: convert_config" in full.stderr  # the backend built its args
    assert "lifecycle: patch build_args" in full.stderr  # and the build_args patches ran
    assert list(tmp_path.iterdir()) == []
    validate = primus("config", "validate", str(DUMMY), "--stage", "posttrain", cwd=tmp_path)
    dry_run = primus("train", "posttrain", "-c", str(DUMMY), "--dry-run", cwd=tmp_path)
    for result in (validate, dry_run):
        assert result.returncode == 2 and "Traceback" not in result.stderr
    assert validate.stderr.splitlines()[-2:] == dry_run.stderr.splitlines()[-2:]
    assert "the dummy backend has no 'posttrain' stage" in validate.stderr


def test_a_run_in_process_that_shields_the_test_process_fails_at_once(tmp_path) -> None:
    """A training command run in process outside `in_process` shields the process's helpers
    for good (its later forks would ignore SIGTERM): `run_in_process` fails at once, naming the
    fix. In a process of its own, since the shield cannot be undone."""
    program = (
        "from pathlib import Path\n"
        "from primus.testing.fuzz_runs import run_in_process\n"
        f"run_in_process(['train', 'pretrain', '--config', 'missing.yaml'], Path({str(tmp_path)!r}), {{}})\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 1
    assert "AssertionError: primus train pretrain --config missing.yaml shielded" in result.stderr
    assert "run it within primus.testing.in_process.in_process()" in result.stderr
