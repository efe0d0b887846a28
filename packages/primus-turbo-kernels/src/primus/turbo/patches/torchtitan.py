"""Turbo kernels in TorchTitan's models and loss.

TorchTitan 0.3 builds every module from a config tree: `X.Config(...).build()` constructs `X`.
Each patch swaps, at `build_args` (before `trainer.init` builds anything), the config nodes of
exactly one upstream class in `Trainer.Config` (the model under `model_spec`, and `loss`) for a
subclass whose forward runs the Triton kernel, as TorchTitan's own `override.imports` does.
Parameter names, initialisation and sharding configs carry over (`derive`), so checkpoints and
FSDP2 are unchanged. The kernels are custom ops, so torch.compile keeps them in its graph.
DTensor inputs (tensor parallel with `parallelism.spmd_backend` partial_dtensor/full_dtensor)
take the upstream forward; the default spmd_types backend hands modules plain local tensors.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from primus.core.errors import ConfigError
from primus.core.logging import log_rank_0
from primus.core.patches import TESTED, PatchContext, get_args, get_param, register_patch
from primus.turbo.fp8 import FP8, PARAMS, fp8_recipe
from primus.turbo.switches import register_switches, turbo_patch, turned_on

FEATURES = {
    "rms_norm": "Triton RMSNorm in every norm",
    "swiglu": "Triton SwiGLU as the feed-forward activation",
    "cross_entropy": "Triton cross-entropy as the loss",
}
register_switches("torchtitan", FEATURES, opt_in=FP8, params=PARAMS)
_turbo = partial(turbo_patch, "torchtitan", backend_versions=TESTED)


def _replacements() -> dict[str, tuple[Any, Any]]:  # upstream classes: untyped
    from primus.turbo.torchtitan_modules import REPLACEMENTS

    return REPLACEMENTS


def swap_configs(config: Any, feature: str) -> list[str]:
    """Replace every node of exactly the upstream class's Config in `config` by the turbo
    class's (fields copied); returns their paths. Nodes already swapped are left alone."""
    from torchtitan.config import derive

    upstream, turbo = _replacements()[feature]
    nodes = [node for node in config.traverse(upstream.Config) if type(node[1]) is upstream.Config]
    for _, node, parent, attr in nodes:
        replacement = derive(node, turbo.Config)
        if isinstance(parent, list):
            parent[attr] = replacement
        else:
            setattr(parent, attr, replacement)
    return [path for path, *_ in nodes]


def _swap(ctx: PatchContext, feature: str) -> str | None:
    """Swap `feature`'s class in the run's config; the reason it did nothing, if it did not."""
    swapped = len(swap_configs(get_args(ctx), feature))
    upstream, turbo = _replacements()[feature]
    if not swapped:
        log_rank_0(f"[turbo] {feature}: no {upstream.__name__} in the config")
        return f"no {upstream.__name__} in the config"
    log_rank_0(
        f"[turbo] {feature}: {upstream.__name__} -> {turbo.__name__} ({swapped} in the config)"
    )
    return None


@_turbo("rms_norm", "torchtitan.models.common.nn_modules.RMSNorm")
def turbo_rms_norm(ctx: PatchContext) -> str | None:
    """Every RMSNorm of the model (layer norms, final norm, QK-norms) runs the Triton kernel."""
    return _swap(ctx, "rms_norm")


@_turbo("swiglu", "torchtitan.models.common.feed_forward.FeedForward")
def turbo_swiglu(ctx: PatchContext) -> str | None:
    """Every dense feed-forward computes silu(w1(x)) * w3(x) with the Triton SwiGLU kernel."""
    return _swap(ctx, "swiglu")


@_turbo("cross_entropy", "torchtitan.components.loss.CrossEntropyLoss")
def turbo_cross_entropy(ctx: PatchContext) -> str | None:
    """The training loss (each chunk of ChunkedLossWrapper) runs the Triton cross-entropy."""
    return _swap(ctx, "cross_entropy")


BLOCK = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # the linears of block i: `...layers.<i>.<...>`


def swap_fp8_linears(config: Any, recipe: str) -> list[str]:
    """Swap the Linear config nodes inside the transformer blocks (`layers.<i>.`) for FP8
    ones, except those of the first and the last block; returns their paths."""
    from torchtitan.config import derive

    upstream, turbo = _replacements()["fp8"]
    found = [
        (int(match.group(1)), path, node, parent, attr)
        for path, node, parent, attr in config.traverse(upstream.Config)
        if type(node) is upstream.Config and (match := BLOCK.search(path))
    ]
    blocks = [index for index, *_ in found]
    swapped = []
    for index, path, node, parent, attr in found:
        if min(blocks) < index < max(blocks):
            replacement = derive(node, turbo.Config, fp8_recipe=recipe)
            if isinstance(parent, list):
                parent[attr] = replacement
            else:
                setattr(parent, attr, replacement)
            swapped.append(path)
    return swapped


@_turbo("fp8", "torchtitan.models.common.linear.Linear (inside the transformer blocks)")
def turbo_fp8(ctx: PatchContext) -> str | None:
    """The linears of every transformer block but the first and last run their GEMMs in FP8
    (`turbo.fp8_recipe`); refused (exit 2) where the hardware has no FP8, and the delayed
    recipe under `compile.enable` (its amax history lives outside the compiled graph)."""
    recipe = fp8_recipe(ctx)
    if recipe == "delayed" and get_param(ctx, "compile.enable"):
        raise ConfigError(
            "turbo.fp8_recipe: delayed keeps its amax history outside torch.compile's graphs; "
            "set compile.enable: false, or turbo.fp8_recipe: tensorwise"
        )
    swapped = swap_fp8_linears(get_args(ctx), recipe)
    if not swapped:
        log_rank_0("[turbo] fp8: no Linear inside a block but the first and last")
        return "no Linear inside a block but the first and last"
    log_rank_0(f"[turbo] fp8 ({recipe}): Linear -> TurboFP8Linear ({len(swapped)} in the config)")
    return None


def _float8_without_torchao(ctx: PatchContext) -> bool:
    """model.float8 is true, torchao is not installed, and turbo is on"""
    import importlib.util

    return (
        bool(get_param(ctx, "model.float8"))
        and importlib.util.find_spec("torchao") is None
        and turned_on(ctx)[0]
    )


@register_patch(
    "torchtitan.turbo_float8",
    backend="torchtitan",
    phase="setup",
    priority=-1,  # before the turbo line of the log, which then lists fp8
    condition=_float8_without_torchao,
    target="model.float8, turbo.fp8",
    tags=("turbo",),
)
def float8_as_turbo_fp8(ctx: PatchContext) -> None:
    """TorchTitan's float8 linears (`model.float8`) are torchao's: without torchao, turbo's FP8
    linears (`turbo.fp8`) train in their place."""
    why = "model.float8 without torchao: turbo's FP8 linears instead"
    ctx.set_param("model.float8", False, why)
    ctx.set_param("turbo.fp8", True, why)
