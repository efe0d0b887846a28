"""primus-testing's conformance suite against the megatron backend (real megatron-core, on CPU)."""

from pathlib import Path

from primus.testing import BackendConformance

RECIPES = Path(__file__).resolve().parents[3] / "configs" / "megatron"


class TestMegatronConformance(BackendConformance):
    backend = "megatron"
    upstream_modules = ("megatron", "torch")
    example_config = RECIPES / "tiny-cpu.yaml"
    smoke_overrides = ["train_iters=3"]
