"""LoRA on MaxText through qwix: each targeted projection of the NNX model gets `kernel_lora_a`
(in x rank) and `kernel_lora_b` (rank x out), `nnx.LoRAParam`s, its output plus
(alpha / rank) x A B (qwix's `LoraProvider`). MaxText's own loop does the rest once its
`lora.enable_lora` is set: the optimizer holds (and `train_step` differentiates) the
`LoRAParam`s only, and its checkpoints hold the adapters, their optimizer state and the step.

Core's `peft.target_modules` are HF (Llama-family) names, mapped to MaxText's modules
(`MODULES`). A is drawn as PEFT draws it (kaiming-uniform, a = sqrt(5): uniform within
1 / sqrt(in)), B is zeros. Scanned layers stack each adapter on MaxText's layer axis
(`param_scan_axis`, 1), as they stack the kernel.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from primus.core.config.posttrain import PeftConfig

# HF name -> MaxText module (under each decoder layer)
MODULES = {
    "q_proj": "self_attention/query",
    "k_proj": "self_attention/key",
    "v_proj": "self_attention/value",
    "o_proj": "self_attention/out",
    "gate_proj": "mlp/wi_0",
    "up_proj": "mlp/wi_1",
    "down_proj": "mlp/wo",
}
SIDES = ("kernel_lora_a", "kernel_lora_b")


def module_path(targets: tuple[str, ...] | list[str]) -> str:
    """qwix's `module_path` regex (matched in full) for the HF-named targets: those modules
    of every decoder layer, scanned (`decoder/layers/...`) or not (`decoder/layers_N/...`)."""
    return rf"decoder/layers(_\d+)?/({'|'.join(MODULES[t] for t in targets)})"


def maxtext_lora(peft: PeftConfig) -> dict[str, Any]:
    """MaxText's `lora` config section for `peft:` (what turns on its LoRA training)."""
    return {
        "enable_lora": True,
        "lora_rank": peft.rank,
        "lora_alpha": peft.alpha,
        "lora_module_path": module_path(peft.target_modules),
    }


def _peft_uniform(key: Any, shape: Any, dtype: Any = None) -> Any:
    """PEFT's draw of A (nn.Linear's kaiming-uniform, a = sqrt(5)) for a (.., in, rank) A:
    uniform within 1 / sqrt(in)."""
    import jax
    import jax.numpy as jnp

    bound = 1.0 / np.sqrt(shape[-2])
    return jax.random.uniform(key, shape, dtype or jnp.float32, -bound, bound)


def apply(model: Any, mesh: Any, config: Any, start: dict[str, Any] | None = None) -> Any:
    """The NNX `model` with qwix's LoRA on the modules of MaxText's `config.lora`, the
    adapters replicated (as MaxText's own `lora_utils.apply_lora_to_model` lays them out),
    starting from `start` (MaxText kernel key -> (A, B)) when given."""
    import jax
    import jax.numpy as jnp
    import qwix  # type: ignore[import-untyped]
    from flax import nnx

    from primus.backends.maxtext.posttrain.lora_provider import LoraProvider

    lora = config.lora
    provider = LoraProvider(
        module_path=lora.lora_module_path, rank=lora.lora_rank, alpha=lora.lora_alpha,
        lora_a_initializer=_peft_uniform,
    )  # fmt: skip
    tokens = jnp.zeros((_batch(mesh), 1), jnp.int32)
    rngs = getattr(getattr(model, "decoder", model), "rngs", None)
    model = qwix.apply_lora_to_model(
        model, provider, decoder_input_tokens=tokens, decoder_positions=tokens, rngs=rngs
    )
    for _, node in nnx.iter_graph(model):
        if hasattr(node, "__dict__") and "qwix_rngs" in node.__dict__:
            del node.qwix_rngs
        if isinstance(node, nnx.LoRAParam):
            node.set_metadata(sharding=jax.sharding.PartitionSpec(), out_sharding=None,
                              sharding_names=None)  # fmt: skip
    if start is not None:
        _start_from(model, start)
    return model


def _start_from(model: Any, start: dict[str, Any]) -> None:
    """Each adapter of the NNX `model` set from `start` (MaxText kernel key -> (A, B))."""
    import jax.numpy as jnp
    from flax import nnx

    from primus.core.errors import ConfigError

    for path, node in nnx.iter_graph(model):
        if not isinstance(node, nnx.LoRAParam):
            continue
        key = "-".join(["params", *map(str, path[:-1]), "kernel"])
        value = start[key][SIDES.index(str(path[-1]))]
        held = node.get_value()
        if tuple(value.shape) != tuple(held.shape):
            raise ConfigError(f"init_from.adapter: {key} {path[-1]} is {list(value.shape)} "
                              f"for MaxText, whose model holds {list(held.shape)}")  # fmt: skip
        node.set_value(jnp.asarray(value, held.dtype))


def _batch(mesh: Any) -> int:
    """The smallest batch the mesh's data axes split (qwix traces one forward pass)."""
    if mesh is None:
        return 1
    return int(
        np.prod([mesh.shape.get(a, 1) for a in ("data", "fsdp", "fsdp_transpose", "expert")])
    )


def count(model: Any) -> tuple[int, int]:
    """(adapter parameters, every parameter) of the NNX `model`."""
    from flax import nnx

    sizes = [(isinstance(v, nnx.LoRAParam), int(np.prod(v.get_value().shape)))
             for _, v in nnx.iter_graph(model) if isinstance(v, nnx.Param)]  # fmt: skip
    return sum(n for lora, n in sizes if lora), sum(n for _, n in sizes)


def delta(a: np.ndarray, b: np.ndarray, shape: tuple[int, ...], scaling: float, axis: int | None):
    """The update (alpha / rank) A B of a kernel of `shape`, from its adapters as MaxText
    stores them (A: in.. x rank, B: rank x out.., flattened; stacked on `axis` when the layers
    are scanned), in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if axis is None:
        return scaling * (a @ b).reshape(shape)
    a, b = np.moveaxis(a, axis, 0), np.moveaxis(b, axis, 0)
    layers = [(a[i] @ b[i]).reshape(shape[:axis] + shape[axis + 1 :]) for i in range(len(a))]
    return scaling * np.stack(layers, axis=axis)


def describe(peft: PeftConfig) -> str:
    """The adapters `peft:` asks for, as the run logs them."""
    start = f"; the adapters start from {peft.adapter}" if peft.adapter else ""
    return (f"rank {peft.rank}, alpha {peft.alpha:g} (scaling {peft.scaling:g}), on "
            f"{', '.join(peft.target_modules)}{start}")  # fmt: skip
