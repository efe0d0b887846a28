"""Turbo by default: `turbo.enable: auto` turns the kernels on for a run on a GPU and off on the
CPU, and each shipped recipe resolves as docs/turbo.md says; every run's log says which. The
recipes are resolved as `primus train` resolves them (no run: this machine has no GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.core.patches import PatchContext
from primus.core.runtime.resolution import load
from primus.turbo.patches import megatron, torchtitan
from primus.turbo.switches import enabled, status

CONFIGS = Path(__file__).parents[3] / "configs"
FEATURES = {"megatron": megatron.FEATURES, "torchtitan": torchtitan.FEATURES}
# (recipe, overrides) -> the turbo line of its log
EXPECTED = {
    ("megatron/llama3.2_1B-pretrain.yaml", ()): "on: the run is on a GPU (turbo.enable: auto): "
    + ", ".join(megatron.FEATURES) + "; turbo.enable: false turns them off",
    ("megatron/llama3.2_1B-pretrain.yaml", ("turbo.cuda_graphs=false",)): "on: the run is on a GPU "
    "(turbo.enable: auto): rms_norm, swiglu, rope, qkv_rope, attention, cross_entropy, "
    "optimizer, grad_accum_fusion (turbo.cuda_graphs: false); turbo.enable: false turns them off",
    ("megatron/llama3.1_8B-pretrain.yaml", ("turbo.enable=false",)): "off: turbo.enable is false",
    ("torchtitan/llama3.2_1B-pretrain.yaml", ()): "on: the run is on a GPU (turbo.enable: auto): "
    "rms_norm, swiglu, cross_entropy; turbo.enable: false turns them off",
    ("torchtitan/tiny-cpu.yaml", ()): "off: the run is on the CPU (turbo.enable: auto; true "
    "runs the kernels there)",
    ("torchtitan/tiny-cpu.yaml", ("turbo.enable=true",)): "on: turbo.enable is true: rms_norm, "
    "swiglu, cross_entropy; turbo.enable: false turns them off",
}  # fmt: skip


@pytest.mark.parametrize(("recipe", "overrides"), list(EXPECTED), ids=lambda v: str(v))
def test_each_shipped_recipe_resolves_turbo_as_documented(
    recipe: str, overrides: tuple[str, ...]
) -> None:
    module = next(iter(load(CONFIGS / recipe, list(overrides)).modules.values()))
    ctx = PatchContext(module.framework, "setup", None, "0", module.params)
    assert status(ctx, FEATURES[module.framework]) == EXPECTED[(recipe, overrides)]
    on = EXPECTED[(recipe, overrides)].startswith("on")
    assert enabled(ctx, "rms_norm") is on
    assert enabled(ctx, "cross_entropy") is on


def test_turbo_enable_takes_auto_true_or_false_only() -> None:
    from primus.core.config.schema import registered_params

    for backend in FEATURES:
        spec = registered_params(backend).specs["turbo.enable"]
        assert spec.default == "auto"
        assert [spec.type_error(v) for v in ("auto", True, False)] == [None, None, None]
        assert spec.type_error("maybe") == "must be one of 'auto', True, False, got 'maybe'"
        assert spec.type_error(1) == "must be a boolean or a string, got int 1"
