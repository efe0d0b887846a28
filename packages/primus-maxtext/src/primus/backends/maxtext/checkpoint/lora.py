"""A LoRA run's checkpoints out of MaxText: the merged HF model and the PEFT adapter.

A LoRA checkpoint holds the adapters (`<kernel>_lora_a`, `<kernel>_lora_b` beside each
targeted kernel: `posttrain.lora`); the frozen weights are the HF import's. The merged export
writes each targeted kernel plus its update, through MaxText's hooks as any export. The PEFT
adapter's factors come from the same hooks: B through the hook of a kernel whose first rank
rows are B (MaxText's hooks permute and scale a projection's outputs, never its inputs), A
transposed; `adapter_factors` checks that their product is the hooked update.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from primus.backends.maxtext.checkpoint.hf_mapping import Tables, slot_jobs
from primus.backends.maxtext.posttrain.lora import SIDES, delta
from primus.core.errors import ConfigError


def enabled(config: Any) -> bool:
    """Whether MaxText's `config` trains LoRA adapters (patch maxtext.lora)."""
    return bool(config.lora.enable_lora)


def scaling(config: Any) -> float:
    return config.lora.lora_alpha / config.lora.lora_rank


def base_step(config: Any) -> Path:
    """The step folder of the HF import, which holds a LoRA run's frozen weights."""
    if not config.load_parameters_path:
        raise ConfigError("a LoRA run's export needs its HF import (init_from)")
    return Path(config.load_parameters_path).parent


def _adapter_key(key: str, side: str) -> str:
    return f"{key.removesuffix('kernel')}{side}"


def read_adapters(config: Any, step: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """MaxText kernel key -> its (A, B) as the checkpoint `step` stores them."""
    from orbax.checkpoint import v1 as ocp

    from primus.backends.maxtext.checkpoint.orbax_params import load_params

    tree = ocp.metadata(str(step), checkpointable_name="items").metadata["params"]
    leaves = {}
    for path, leaf in _walk(tree, ()):
        if path[-1] in SIDES:
            leaves["-".join(path)] = leaf
    if not leaves:
        raise ConfigError(f"{step}: the checkpoint holds no LoRA adapters",
                          hint="it was not written by a run with a peft: section")  # fmt: skip
    host = _host()
    abstract = {k: host(v.shape, v.dtype) for k, v in leaves.items()}
    loaded = {k: np.asarray(v) for k, v in load_params(config, abstract, step).items()}
    kernels = sorted({k.rsplit("-", 1)[0] + "-kernel" for k in loaded})
    return {
        k: (loaded[_adapter_key(k, SIDES[0])], loaded[_adapter_key(k, SIDES[1])]) for k in kernels
    }


def _walk(tree: Any, path: tuple[str, ...]) -> Any:
    if isinstance(tree, dict):
        for name, sub in tree.items():
            yield from _walk(sub, (*path, name))
    else:
        yield path, tree


def _host() -> Any:
    import jax

    host = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    return functools.partial(jax.ShapeDtypeStruct, sharding=host)


def scan_axis(found: Tables, key: str) -> int | None:
    """The axis MaxText stacks the layers of parameter `key` on (None: one layer's)."""
    names = found.mapping[key]
    return found.config.param_scan_axis if isinstance(names, list) else None


def merged(found: Tables, key: str, weight: np.ndarray, adapters: dict[str, Any]) -> np.ndarray:
    """Parameter `key` with its LoRA update added (as it is where it has none)."""
    if key not in adapters:
        return weight
    a, b = adapters[key]
    update = delta(a, b, weight.shape, scaling(found.config), scan_axis(found, key))
    return (weight + update).astype(weight.dtype)


def adapter_factors(found: Tables, adapters: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """HF module name -> (A: rank x in, B: out x rank) of each adapted HF linear, float32
    torch tensors: its hooked update is (alpha / rank) B A, as PEFT computes it."""
    import sys

    from maxtext.checkpoint_conversion.utils.tensor_handling import apply_hook_fns

    if "torch" in sys.modules and sys.modules["torch"] is None:  # hidden (the adapter's
        del sys.modules["torch"]  # unused_modules) for JAX's sake; PEFT's format needs it
    import torch

    factors = {}
    for key, (a, b) in adapters.items():
        axis = scan_axis(found, key)
        for _, index, name, one in slot_jobs(found, key):
            layer = index[axis] if axis is not None else slice(None)
            a_i = np.asarray(a[(slice(None),) * (axis or 0) + (layer,)], np.float64)
            b_i = np.asarray(b[(slice(None),) * (axis or 0) + (layer,)], np.float64)
            rank = a_i.shape[-1]
            a_i, b_i = a_i.reshape(-1, rank), b_i.reshape(rank, -1)
            shape, hooks = found.hf_shapes[name], found.hooks.get(key)
            rows = np.zeros((a_i.shape[0], b_i.shape[1]))
            rows[:rank] = b_i
            hf_b = np.asarray(apply_hook_fns(rows.reshape(one), shape, hooks))[:, :rank]
            update = np.asarray(apply_hook_fns((a_i @ b_i).reshape(one), shape, hooks))
            if not np.allclose(hf_b @ a_i.T, update, rtol=1e-6, atol=1e-9):
                raise ConfigError(f"MaxText's conversion of {key} to {name} moves its inputs: "
                                  "no PEFT adapter of it")  # fmt: skip
            module = name.removesuffix(".weight")
            factors[module] = (torch.from_numpy(a_i.T.astype(np.float32)),
                               torch.from_numpy(hf_b.astype(np.float32)))  # fmt: skip
    return factors


def from_peft(found: Tables, factors: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """MaxText kernel key -> (A, B) as the model holds them, from a PEFT adapter's factors
    (HF module name -> (A, B), `peft_adapter.read_adapter`) through the import's hooks
    (`found` built with saving_to_hf=False): the inverse of `adapter_factors`."""
    from maxtext.checkpoint_conversion.utils.tensor_handling import apply_hook_fns

    adapters = {}
    for key in found.params:
        jobs = [j for j in slot_jobs(found, key) if j[2].removesuffix(".weight") in factors]
        if not jobs:
            continue
        a_layers, b_layers = [], []
        for _, _, name, one in jobs:
            a_hf, b_hf = (np.asarray(f, np.float32) for f in factors[name.removesuffix(".weight")])
            rank = a_hf.shape[0]
            columns = np.zeros(found.hf_shapes[name], np.float32)
            columns[:, :rank] = b_hf
            kernel = np.asarray(apply_hook_fns(columns, one, found.hooks.get(key)))
            a_layers.append(a_hf.T)
            b_layers.append(kernel.reshape(a_hf.shape[1], -1)[:rank])
        axis = scan_axis(found, key)
        if axis is None:
            adapters[key] = (a_layers[0], b_layers[0])
        else:
            adapters[key] = (np.stack(a_layers, axis), np.stack(b_layers, axis))
    return adapters


def peft_start(config: Any, hf_dir: Any, folder: Any) -> dict[str, Any]:
    """The adapters (MaxText kernel key -> (A, B)) of the PEFT adapter in `folder`, for the
    model of MaxText's `config` imported from the HF model in `hf_dir`."""
    from primus.backends.maxtext.checkpoint.hf_mapping import tables
    from primus.backends.maxtext.checkpoint.query_record import scaled_at_run_time
    from primus.core.checkpoint.hf import read_config
    from primus.core.checkpoint.peft_adapter import read_adapter

    factors = {name: (a.numpy(), b.numpy()) for name, (a, b) in read_adapter(folder).items()}
    at_run_time = scaled_at_run_time(config)
    found = tables(config, read_config(hf_dir), saving_to_hf=False, query_at_run_time=at_run_time)
    return from_peft(found, factors)
