"""primus-testing's conformance suite against the maxtext backend (real maxtext, on CPU)."""

from pathlib import Path

from primus.testing import BackendConformance

RECIPES = Path(__file__).resolve().parents[3] / "configs" / "maxtext"


class TestMaxTextConformance(BackendConformance):
    backend = "maxtext"
    upstream_modules = ("maxtext", "jax", "jaxlib", "flax", "orbax")
    example_config = RECIPES / "tiny-cpu.yaml"
    smoke_overrides = ["steps=2"]
