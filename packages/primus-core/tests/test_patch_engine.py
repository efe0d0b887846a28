"""The engine's ways to change things: set_param, replace, wrap, requires; idempotence, restore."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator

import pytest

from primus.core.config.render import to_yaml
from primus.core.config.tree import ConfigTree, single_value_tree
from primus.core.errors import Origin, PatchError
from primus.core.patches import TESTED, PatchContext, register_patch, restore_all
from primus.core.patches.rebind import active
from primus.core.patches.registry import get_patch
from primus.core.patches.runner import PatchRunner
from primus.core.patches.selection import parse_selection


@pytest.fixture
def upstream() -> Iterator[types.SimpleNamespace]:
    """A fake upstream package `toyup`: `toyup.core` defines things, `toyup.user` copies them."""
    core = types.ModuleType("toyup.core")
    exec(
        "def loss(x):\n    return x\n"
        "class Model:\n"
        "    def forward(self):\n        return 'up'\n"
        "    @staticmethod\n    def kernel():\n        return 'up'\n"
        "class Sub(Model):\n    pass\n"
        "device_type = 'cuda'\n",
        core.__dict__,
    )
    user = types.ModuleType("toyup.user")
    user.loss, user.renamed, user.device_type = core.loss, core.loss, core.device_type
    other = types.ModuleType("elsewhere")
    other.loss = core.loss
    modules = {"toyup": types.ModuleType("toyup"), "toyup.core": core, "toyup.user": user}
    modules["elsewhere"] = other
    sys.modules.update(modules)
    yield types.SimpleNamespace(core=core, user=user, other=other)
    restore_all()
    for name in modules:
        sys.modules.pop(name, None)


def run_patches(tree: ConfigTree | dict, phase: str = "setup") -> PatchRunner:
    runner = PatchRunner("toy", parse_selection("all", "test"))
    if isinstance(tree, ConfigTree):
        runner.run(PatchContext("toy", phase, "1.0", "0", tree.data, config_tree=tree))
    else:
        runner.run(PatchContext("toy", phase, "1.0", "0", tree))
    return runner


def test_replace_rebinds_every_importer_once_and_restores(upstream) -> None:
    def fast(x):
        return 2 * x

    @register_patch("t.fast", backend="toy", phase="setup")
    def patch(ctx: PatchContext) -> None:
        """Use the fast loss."""
        ctx.replace("toyup.core", "loss", fast)

    original = upstream.core.loss
    first = run_patches({})
    assert upstream.core.loss is upstream.user.loss is upstream.user.renamed is fast
    assert upstream.other.loss is original  # outside `within` (toyup)
    sites = first.outcomes["t.fast"].replaced
    assert sites == [
        {
            "target": "toyup.core.loss",
            "sites": ["toyup.user.loss", "toyup.user.renamed", "toyup.core.loss"],
        }
    ]
    second = run_patches({})  # applying twice changes nothing
    assert second.outcomes["t.fast"].status == "applied"
    assert [r.sites for r in active("t.fast")] == [sites[0]["sites"]]
    assert upstream.core.loss is fast
    assert restore_all() == ["toyup.core.loss"]
    assert upstream.core.loss is upstream.user.loss is upstream.user.renamed is original
    assert active() == []


def test_a_constant_is_rebound_only_under_its_own_name(upstream) -> None:
    upstream.user.unrelated = upstream.core.device_type  # the same str object, another name
    ctx = PatchContext("toy", "setup", None, "0", {})
    with ctx.running("t.cpu"):
        assert ctx.replace(upstream.core, "device_type", "cpu") == [
            "toyup.user.device_type",
            "toyup.core.device_type",
        ]
    assert upstream.user.unrelated == "cuda"


def test_wrap_never_wraps_twice_and_class_attributes_restore_exactly(upstream) -> None:
    built = []

    def wrapper(original):
        built.append(original)
        return lambda self: "wrapped " + original(self)

    ctx = PatchContext("toy", "setup", None, "0", {})
    with ctx.running("t.wrap"):
        assert ctx.wrap("toyup.core.Model", "forward", wrapper) == ["toyup.core.Model.forward"]
        assert ctx.wrap("toyup.core.Model", "forward", wrapper) == []  # already in place:
        # a fresh wrapper (a second run's state) of upstream's original takes the old one's place
        ctx.replace(upstream.core.Model, "kernel", staticmethod(lambda: "fast"))
        ctx.replace(upstream.core.Sub, "forward", lambda self: "sub")  # inherited: an override
    model = upstream.core.Model()
    assert model.forward() == "wrapped up" and model.kernel() == "fast"
    assert len(built) == 2 and built[0] is built[1]
    restore_all("t.wrap")
    assert model.forward() == "up" and upstream.core.Model.kernel() == "up"
    assert isinstance(vars(upstream.core.Model)["kernel"], staticmethod)
    assert "forward" not in vars(upstream.core.Sub)


def test_set_param_records_the_patch_as_origin_and_what_it_replaced(tmp_path) -> None:
    tree = ConfigTree()
    tree.merge(single_value_tree(("lr",), 0.1, Origin("file", "/x/exp.yaml", 3)))

    @register_patch("t.set", backend="toy", phase="setup")
    def patch(ctx: PatchContext) -> None:
        """Sets two params."""
        ctx.set_param("lr", 0.5, "the toy needs it")
        ctx.set_param("data.mock", True, "no data given")

    runner = run_patches(tree)
    assert tree.data == {"lr": 0.5, "data": {"mock": True}}
    text = to_yaml(tree, provenance=True)
    assert "lr: 0.5  # patch t.set (overrode 0.1 from /x/exp.yaml:3)" in text
    assert "mock: true  # patch t.set" in text
    runner.write_report(tmp_path / "report.json")
    entry = json.loads((tmp_path / "report.json").read_text())["patches"][0]
    assert entry["params_set"] == [
        {
            "key": "lr",
            "value": 0.5,
            "reason": "the toy needs it",
            "was": 0.1,
            "was_from": "/x/exp.yaml:3",
        },
        {"key": "data.mock", "value": True, "reason": "no data given"},
    ]
    assert "set lr=0.5, data.mock=True" in runner.table()
    before = (dict(tree.origins), dict(tree.replaced))
    again = run_patches(tree)  # applying twice changes nothing
    assert (tree.origins, tree.replaced) == before and again.outcomes["t.set"].params_set == []


def test_a_direct_write_names_the_patch_and_points_at_set_param() -> None:
    @register_patch("t.direct", backend="toy", phase="setup")
    def patch(ctx: PatchContext) -> None:
        """Writes the params directly."""
        ctx.params["nested"]["x"] = 2

    params = {"nested": {"x": 1}}
    with pytest.raises(PatchError, match=r"patch 't\.direct' writes ctx\.params directly") as err:
        run_patches(params)
    assert "ctx.set_param" in str(err.value.__cause__) and params == {"nested": {"x": 1}}
    with pytest.raises(PatchError, match="call it from a handler"):
        PatchContext("toy", "setup", None, "0", {}).set_param("x", 1, "outside a patch")


def test_requires_runs_a_patch_only_if_the_other_applied() -> None:
    register_patch(
        "t.base", backend="toy", phase="setup", condition=lambda c: c.params["on"], description="d"
    )(lambda c: None)
    register_patch(
        "t.after_base", backend="toy", phase="build_args", requires="t.base", description="d"
    )(lambda c: None)
    off = run_patches({"on": False})
    off.run(PatchContext("toy", "build_args", "1.0", "0", {"on": False}))
    assert off.outcomes["t.after_base"].reason.startswith("requires t.base, which was skipped")
    on = run_patches({"on": True})
    on.run(PatchContext("toy", "build_args", "1.0", "0", {"on": True}))
    assert on.outcomes["t.after_base"].status == "applied"
    register_patch("t.orphan", backend="toy", phase="setup", requires="t.nope", description="d")(
        lambda c: None
    )
    with pytest.raises(
        PatchError, match=r"requires 't\.nope', which is not a patch of this backend"
    ):
        run_patches({})
    with pytest.raises(PatchError, match="requires must name another patch"):
        register_patch("t.self", backend="toy", phase="setup", requires="t.self")(lambda c: None)


def test_tested_gates_on_the_range_the_backend_declares_once(toy_backend, monkeypatch) -> None:
    monkeypatch.setattr(toy_backend, "tested_versions", ">=1,<2")
    register_patch(
        "t.private", backend="toy", phase="setup", backend_versions=TESTED, description="d"
    )(lambda c: None)
    patch = get_patch("t.private")
    assert patch is not None and patch.gate_text == "<2,>=1"
    runner = PatchRunner("toy", parse_selection("all", "test"))
    runner.run(PatchContext("toy", "setup", "2.0", "0", {}))
    assert runner.outcomes["t.private"].reason == "version mismatch: 2.0 not in <2,>=1"
