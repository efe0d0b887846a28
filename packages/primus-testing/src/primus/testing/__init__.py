"""The conformance suite every backend package's tests subclass (LangChain partner-package style).

    from primus.testing import BackendConformance

    class TestMyBackendConformance(BackendConformance):
        backend = "mybackend"
        upstream_modules = ("myframework",)
        example_config = Path(__file__).parent / "tiny.yaml"
        smoke_overrides = ["train_iters=2"]

pytest then checks the adapter contract, the schema, that presets resolve and validate, that
the adapter and patch modules import without the upstream, and the lifecycle end to end.

The suite (and pytest) is imported on first use: `primus train` loads the test-only patches of
`primus.testing.patches` through this package and must not pay for pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from primus.testing.conformance import BackendConformance

__all__ = ["BackendConformance"]


def __getattr__(name: str) -> Any:
    if name == "BackendConformance":
        from primus.testing.conformance import BackendConformance

        return BackendConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
