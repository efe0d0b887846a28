"""The patch engine: registration checks, order, selection, gates, failures, the report."""

from __future__ import annotations

import inspect
import json

import pytest

from primus.core.errors import ConfigError, PatchError
from primus.core.patches import PatchContext, get_args, get_param, register_patch
from primus.core.patches.inventory import deep_dive, render
from primus.core.patches.registry import all_patches
from primus.core.patches.runner import PatchRunner
from primus.core.patches.selection import parse_selection, selection_for


def ctx(phase: str = "setup", version: str | None = "1.5.0", **params) -> PatchContext:
    return PatchContext("toy", phase, version, "0", params, backend_args={"x": 1})


def noop(ctx: PatchContext) -> None:
    """Does nothing."""


def test_registration_is_validated_on_the_spot() -> None:
    register_patch("t.one", backend="toy", phase="setup")(noop)
    with pytest.raises(PatchError, match=r"duplicate patch id 't.one'"):
        register_patch("t.one", backend="toy", phase="setup")(noop)
    with pytest.raises(PatchError, match=r"unknown phase 'setpu'"):
        register_patch("t.two", backend="toy", phase="setpu")(noop)
    with pytest.raises(PatchError, match=r"not a PEP 440 specifier"):
        register_patch("t.three", backend="toy", phase="setup", backend_versions="~~1")(noop)
    with pytest.raises(PatchError, match=r"description or a docstring"):
        register_patch("t.four", backend="toy", phase="setup")(lambda c: None)


def test_description_falls_back_to_the_docstring_and_order_is_priority_then_registration() -> None:
    for pid, prio in (("t.b", 50), ("t.a", 50), ("t.first", 1)):
        register_patch(pid, backend="toy", phase="build_args", priority=prio)(noop)
    register_patch("t.setup", backend="toy", phase="setup", priority=99, description="explicit")(
        noop
    )
    ids = [p.id for p in all_patches("toy")]
    assert ids == ["t.setup", "t.first", "t.b", "t.a"]
    assert all_patches("toy")[1].description == "Does nothing."


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ("all", {"a", "b", "c"}),
        ("none", set()),
        ("a,b", {"a", "b"}),
        ("-a", {"b", "c"}),
        ("all,-a,-c", {"b"}),
        (["a", "c"], {"a", "c"}),
        ("", {"a", "b", "c"}),
    ],
)
def test_selection_syntax(spec, allowed) -> None:
    selection = parse_selection(spec, "test")
    assert {p for p in "abc" if selection.allows(p)} == allowed


def test_env_replaces_config_selection_and_unknown_ids_are_errors(monkeypatch) -> None:
    assert selection_for("a").source == "patches.select"
    monkeypatch.setenv("PRIMUS_PATCHES", "none")
    selection = selection_for("a")
    assert selection.source == "PRIMUS_PATCHES" and not selection.allows("a")
    with pytest.raises(
        ConfigError, match=r"unknown patch 'dumy.summary' \(did you mean: dummy.summary\?\)"
    ):
        parse_selection("-dumy.summary", "PRIMUS_PATCHES").check_ids(["dummy.summary", "x"])


def test_runner_applies_and_skips_with_reasons(tmp_path) -> None:
    seen = []
    register_patch(
        "t.apply", backend="toy", phase="setup", description="d", backend_versions=">=1,<2"
    )(lambda c: seen.append(get_param(c, "opt.deep", "dflt")) or None)
    register_patch("t.old", backend="toy", phase="setup", description="d", backend_versions="<1")(
        noop
    )
    register_patch(
        "t.cond",
        backend="toy",
        phase="setup",
        description="d",
        condition=lambda c: get_param(c, "flag", False),
    )(noop)
    register_patch("t.filtered", backend="toy", phase="setup", description="d")(noop)
    register_patch("t.declined", backend="toy", phase="setup", description="d")(
        lambda c: "nothing to rewrite here"  # a handler that decides at run time
    )
    register_patch("t.args", backend="toy", phase="build_args", description="d")(
        lambda c: get_args(c).update(x=2)
    )
    register_patch("t.later", backend="toy", phase="after_train", description="d")(noop)
    register_patch("other.backend", backend="other", phase="setup", description="d")(noop)
    runner = PatchRunner("toy", parse_selection("-t.filtered", "PRIMUS_PATCHES"))
    context = ctx(opt={"deep": 7})
    runner.run(context)
    context.phase = "build_args"
    runner.run(context)
    assert seen == [7] and context.backend_args == {"x": 2}
    status = {o.id: (o.status, o.reason) for o in runner.outcomes.values()}
    assert status == {
        "t.apply": ("applied", ""),
        "t.old": ("skipped", "version mismatch: 1.5.0 not in <1"),
        "t.cond": ("skipped", 'condition false: lambda c: get_param(c, "flag", False)'),
        "t.filtered": ("skipped", "filtered by PRIMUS_PATCHES"),
        "t.declined": ("skipped", "nothing to rewrite here"),
        "t.args": ("applied", ""),
        "t.later": ("not run", "the run stopped before this phase"),
    }
    runner.write_report(tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["summary"] == {"applied": 2, "skipped": 4, "failed": 0, "not run": 1}
    assert "t.old" in runner.table() and "version mismatch" in runner.table()


def test_unknown_upstream_version_fails_a_version_gate() -> None:
    register_patch(
        "t.gated", backend="toy", phase="setup", description="d", backend_versions=">=1"
    )(noop)
    runner = PatchRunner("toy", parse_selection("all", "x"))
    runner.run(ctx(version=None))
    assert runner.outcomes["t.gated"].reason.startswith(
        "version mismatch: upstream version unknown"
    )


def test_a_failing_patch_stops_the_run_naming_itself_and_its_file() -> None:
    @register_patch("t.bad", backend="toy", phase="setup")
    def bad(c: PatchContext) -> None:
        """Raises."""
        raise ValueError("upstream moved")

    register_patch("t.after", backend="toy", phase="setup", description="d", priority=60)(noop)
    runner = PatchRunner("toy", parse_selection("all", "x"))
    with pytest.raises(
        PatchError,
        match=r"patch 't.bad' \(.*test_patches.py:\d+\) failed in phase setup: ValueError: upstream moved",
    ) as err:
        runner.run(ctx())
    assert isinstance(err.value.__cause__, ValueError)
    assert runner.outcomes["t.bad"].status == "failed"
    assert runner.outcomes["t.after"].status == "not run"


def test_on_error_warn_goes_on_and_a_raising_condition_counts_as_a_failure(caplog) -> None:
    register_patch(
        "t.cond_raises", backend="toy", phase="setup", description="d", condition=lambda c: 1 / 0
    )(noop)
    register_patch("t.after", backend="toy", phase="setup", description="d", priority=60)(noop)
    runner = PatchRunner("toy", parse_selection("all", "x"), on_error="warn")
    runner.run(ctx())
    assert runner.outcomes["t.cond_raises"].status == "failed"
    assert "ZeroDivisionError" in runner.outcomes["t.cond_raises"].reason
    assert runner.outcomes["t.after"].status == "applied"


def test_inventory_and_deep_dive_come_from_metadata() -> None:
    def enabled(c: PatchContext) -> bool:
        """toy.fast is true"""
        return True

    @register_patch(
        "t.wrap",
        backend="toy",
        phase="before_train",
        condition=enabled,
        backend_versions=">=1",
        target="toy.module.fn",
        tags=("perf",),
    )
    def wrap(c: PatchContext) -> None:
        """Wrap toy.module.fn with a faster one."""
        c.wrap("toy.module", "fn", lambda fn: fn)

    rows = json.loads(render(all_patches("toy"), "json"))
    assert rows == [
        {
            "id": "t.wrap",
            "backend": "toy",
            "what it does": "Wrap toy.module.fn with a faster one.",
            "target": "toy.module.fn",
            "code location": rows[0]["code location"],
            "how to enable": "toy.fast is true; upstream >=1",
            "phase": "before_train",
            "priority": "50",
            "version gate": ">=1",
            "tags": "perf",
            "requires": "-",
        }
    ]
    assert rows[0]["code location"].endswith(f"test_patches.py:{inspect.getsourcelines(wrap)[1]}")
    table = render(all_patches("toy"), "markdown")
    assert table.splitlines()[0].startswith(
        "| id | what it does | target | code location | how to enable"
    )
    text = deep_dive(all_patches("toy")[0])
    for needle in (
        "## What it does",
        "## Porting into your own framework",
        "Rebind or wrap `toy.module.fn`",
        "def wrap(c: PatchContext)",
        "PRIMUS_PATCHES=-t.wrap",
    ):
        assert needle in text
