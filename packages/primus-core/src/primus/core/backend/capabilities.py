"""The optional capabilities a backend may declare, each specified apart from its implementations
(pluggy's habit): the hooks it needs and how the runtime calls them. An adapter lists what it
provides in `capabilities`; `contract.contract_problem` verifies the declaration against the
class when the backend is registered or discovered, and core asks `provides()`, never whether
a hook is overridden (`backend_registry.require` for an error naming who has it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Capability:
    """One optional capability: its name (as `capabilities` and `primus backends list` write
    it), what it gives a user, the hooks that implement it with the positional arguments the
    runtime passes them (self aside), and the stage it needs, if any."""

    name: str
    summary: str
    hooks: dict[str, tuple[str, ...]]
    stage: str | None = None


CAPABILITIES = {
    c.name: c
    for c in (
        Capability(
            "hf-import",
            "start from a Hugging Face model (init_from, primus checkpoint import)",
            {
                "model_preset_from_hf": ("hf_config",),
                "hf_import_dir": ("backend_args",),
                "import_hf": ("hf_dir", "backend_args", "out"),
            },
        ),
        Capability(
            "hf-export",
            "write a run's checkpoint as a Hugging Face model (primus checkpoint export)",
            {"export_hf": ("backend_args", "iteration", "out", "dtype")},
        ),
        Capability(
            "checkpoint-inspect",
            "say what a native checkpoint holds (primus checkpoint inspect)",
            {"inspect_checkpoint": ("path",)},
        ),
        Capability(
            "memory-projection",
            "project memory and rank layouts (primus projection)",
            {"training_job": ("backend_args", "gpus", "applied"), "layout_overrides": ("job",)},
        ),
        Capability("lora", "LoRA adapters in post-training (peft:)", {}, stage="posttrain"),
        Capability(
            "lora-export",
            "write a LoRA run's adapters as a PEFT adapter (primus checkpoint export --adapter)",
            {"lora_adapters": ("backend_args", "iteration")},
            stage="posttrain",
        ),
        Capability("dpo", "preference training in post-training (dpo:)", {}, stage="posttrain"),
        Capability(
            "corpus",
            "pretrain on prepared corpora (data:) in their one standard sample order",
            {"corpus_params": ("data",)},
            stage="pretrain",
        ),
    )
}


def provides(adapter: Any, capability: str) -> bool:
    """Whether the adapter (class or instance) declares `capability`."""
    return capability in getattr(adapter, "capabilities", ())


def capability_problem(adapter_cls: Any, implements: Callable[[str], bool]) -> str | None:
    """Why the adapter's `capabilities` do not match its class, or None. `implements(hook)`
    tells whether the adapter defines `hook` itself (not only inherits the default)."""
    name = adapter_cls.__name__
    declared = adapter_cls.capabilities
    if isinstance(declared, str) or not all(isinstance(c, str) for c in declared):
        return f"{name}.capabilities must be a set of names ({', '.join(CAPABILITIES)})"
    for capability in declared:
        if capability not in CAPABILITIES:
            return f"{name} declares an unknown capability '{capability}' (known: " + (
                f"{', '.join(CAPABILITIES)})"
            )
    for capability in CAPABILITIES.values():
        missing = [hook for hook in capability.hooks if not implements(hook)]
        if capability.name in declared:
            if missing:
                return f"{name} declares '{capability.name}' but does not implement {missing[0]}"
            if capability.stage and capability.stage not in adapter_cls.trainers:
                return (
                    f"{name} declares '{capability.name}', which needs a {capability.stage} stage"
                )
        elif len(missing) < len(capability.hooks):
            hook = next(h for h in capability.hooks if h not in missing)
            return (
                f"{name} implements {hook} but does not declare '{capability.name}': add it to "
                "capabilities"
            )
    return None
