"""Run megatron.training on CPU: the CUDA calls it makes, answered by the CPU.

megatron.training asserts CUDA and calls CUDA APIs throughout (streams, events, memory stats,
the CUDA RNG, `device="cuda"` tensors, `.cuda()`). `enable(ctx)` answers them on the CPU, in
this process only, through the patch engine (`ctx.replace` / `ctx.wrap`). Used by the `megatron.cpu` patch; tested on megatron-core 0.19.
"""

from __future__ import annotations

import contextlib
import os
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from primus.core.patches import PatchContext


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True  # a bare index means a CUDA device to torch's factories
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCpu(TorchFunctionMode):
    """Rewrites `device=` CUDA arguments of torch functions and `Tensor.to` to the CPU."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and args and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _Stream:
    """Stands in for torch.cuda.Stream / Event: everything is already synchronous."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: Any) -> float:
        return 0.0

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def _returns(value: Any) -> Any:
    """A new function per stub: TorchDynamo's rules reject one object under two names."""

    def stub(*args: Any, **kwargs: Any) -> Any:
        return value

    return stub


def _cuda_type(original: Any) -> Any:
    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs:
            return original(self, *args, **kwargs)
        name = original(self)  # the optimizer checks for torch.cuda.* types
        return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)

    return type_


def _gloo(init: Any) -> Any:
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("device_id", None)  # a CUDA device id would bind gloo to a missing GPU
        kwargs["backend"] = "gloo"
        return init(*args, **kwargs)

    return init_process_group


def enable(ctx: PatchContext) -> list[str]:
    """Install the shims through the patch engine; returns what changed, for the log ([] when
    they are already in place). Megatron's copies of the replaced names are rebound too."""
    os.environ["TORCHDYNAMO_DISABLE"] = "1"  # no jit warm-up under the stand-in CUDA
    import torch._dynamo

    cuda: dict[str, Any] = {
        "is_available": _returns(True),
        "device_count": _returns(1),
        "current_device": _returns(0),
        "set_device": _returns(None),
        "synchronize": _returns(None),
        "empty_cache": _returns(None),
        "Stream": _Stream,
        "Event": _Stream,
        "current_stream": lambda *a, **k: _Stream(),
        "default_stream": lambda *a, **k: _Stream(),
        "stream": lambda *a, **k: contextlib.nullcontext(),
        "memory_allocated": _returns(0),
        "max_memory_allocated": _returns(0),
        "memory_reserved": _returns(0),
        "max_memory_reserved": _returns(0),
        "reset_peak_memory_stats": _returns(None),
        "reset_max_memory_allocated": _returns(None),
        "memory_stats": lambda *a, **k: {},
        "get_device_name": _returns("cpu"),
        "get_device_capability": _returns((0, 0)),
        "get_device_properties": _returns(
            types.SimpleNamespace(
                name="cpu", major=0, minor=0, total_memory=0, multi_processor_count=1
            )
        ),
        "get_rng_state": lambda *a, **k: torch.get_rng_state(),
        "set_rng_state": lambda state, *a, **k: torch.set_rng_state(state),
        "manual_seed": lambda seed: torch.default_generator.manual_seed(int(seed)),
        "manual_seed_all": lambda seed: torch.default_generator.manual_seed(int(seed)),
        "nvtx": _Stream(),
    }
    accelerator = {
        "current_accelerator": _returns(torch.device("cpu")),
        "is_available": _returns(False),
        "current_device_index": _returns(0),
        "current_stream": lambda *a, **k: _Stream(),
        "synchronize": _returns(None),
    }
    sites = ctx.replace(torch._dynamo.config, "disable", True, within="torch._dynamo.config")
    for owner, stubs in ((torch.cuda, cuda), (torch.accelerator, accelerator)):
        for name, value in stubs.items():
            sites += ctx.replace(owner, name, value, within="megatron")
    sites += ctx.replace(torch.nn.Module, "cuda", lambda self, *a, **k: self, within="megatron")
    sites += ctx.replace(torch.Tensor, "cuda", lambda self, *a, **k: self, within="megatron")
    sites += ctx.wrap(torch.Tensor, "type", _cuda_type, within="megatron")
    sites += ctx.wrap(torch.distributed, "init_process_group", _gloo, within="megatron")
    if not sites:
        return []  # the engine found every shim in place: this process already runs on CPU
    _CudaToCpu().__enter__()  # for the rest of the process
    return [
        "torch.cuda answered on the CPU (no-op streams, events, memory stats; CPU RNG)",
        "device='cuda' tensors and .cuda() stay on the CPU",
        "torch.distributed uses gloo; TorchDynamo off",
    ]


# Fused kernels that exist only for CUDA (Apex, Transformer Engine or torch.jit on GPU).
CUDA_ONLY_FUSIONS = (
    "bias_gelu_fusion",
    "bias_swiglu_fusion",
    "bias_dropout_fusion",
    "masked_softmax_fusion",
    "apply_rope_fusion",
    "gradient_accumulation_fusion",
    "cross_entropy_loss_fusion",
)


def cpu_args(ctx: PatchContext, args: Any) -> list[str]:
    """Megatron args for a CPU run; the model-parallel RNG tracker on the CPU generator."""
    random = "megatron.core.tensor_parallel.random"
    ctx.replace(random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    ctx.replace(random, "_set_cuda_rng_state", lambda state, *a, **k: torch.set_rng_state(state))
    args.use_cpu_initialization = True
    args.distributed_backend = "gloo"
    turned_off = [name for name in CUDA_ONLY_FUSIONS if getattr(args, name, False)]
    for name in turned_off:
        setattr(args, name, False)
    return [
        "use_cpu_initialization=true, distributed_backend=gloo",
        f"CUDA-only fusions off: {', '.join(turned_off) or 'none were on'}",
    ]
