"""primus-testing's conformance suite against the torchtitan backend (real torchtitan, on CPU)."""

from pathlib import Path

from primus.testing import BackendConformance

RECIPES = Path(__file__).resolve().parents[3] / "configs" / "torchtitan"


class TestTorchTitanConformance(BackendConformance):
    backend = "torchtitan"
    upstream_modules = ("torchtitan", "torch")
    example_config = RECIPES / "tiny-cpu.yaml"
    smoke_overrides = ["training.steps=2"]
