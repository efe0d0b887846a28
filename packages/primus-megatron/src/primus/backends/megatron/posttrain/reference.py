"""DPO's reference model on Megatron: the run's initial weights, frozen, also after a resume.
With `peft:`, the model with its LoRA adapters switched off (the frozen base is the HF import);
without, a frozen copy of the HF import's weights (iteration 0) kept beside the model (not a
parameter, not in its state dict) and run with `torch.func.functional_call`. Apart from the
forward step (`dpo`), which the model provider must not import back."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

REFERENCE = "primus_dpo_reference"  # the model's attribute holding the frozen copy (full DPO)


def keep_reference(model: torch.nn.Module, folder: str, args: Any) -> None:
    """Full DPO: hold the weights of the Megatron checkpoint in `folder` (the HF import) beside
    `model` (a GPTModel of one stage) as its reference."""
    from primus.backends.megatron.posttrain.lora import import_weights

    # copies: the loaded tensors may be the model's own parameters (loaded in place)
    weights = {key: t.detach().clone() for key, t in import_weights(model, folder, args).items()}
    missing = [name for name, _ in model.named_parameters() if name not in weights]
    assert not missing, f"not in the HF import {folder}: {missing}"
    setattr(model, REFERENCE, weights)


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """`model` in eval mode within (no dropout), in its own mode after."""
    mode = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(mode)


def _placed(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen copy on the device and in the dtype of the weights it stands for (once)."""
    weights: dict[str, torch.Tensor] = getattr(model, REFERENCE)
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, tensor in weights.items():
        if tensor.device != own[name].device or tensor.dtype != own[name].dtype:
            weights[name] = tensor.to(own[name].device, own[name].dtype)
    return weights


def reference_losses(
    model: Any, lora: bool, inputs: tuple[Any, ...], labels: torch.Tensor
) -> torch.Tensor:
    """The reference's per-token cross-entropy of `labels`, without gradient: `model` (as
    Megatron wraps it) with its adapters off (`lora`), else its frozen copy."""
    from megatron.core.utils import unwrap_model
    from primus.backends.megatron.posttrain.lora import adapters_off

    inner = unwrap_model(model)
    with torch.no_grad(), evaluating(inner):
        if lora:
            with adapters_off(inner):
                return model(*inputs, labels=labels)
        weights = _placed(inner)
        return torch.func.functional_call(inner, weights, inputs, {"labels": labels})
