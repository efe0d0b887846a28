"""The conformance suite every backend package's tests subclass (LangChain partner-package style).

    from primus.core.testing import BackendConformance

    class TestMyBackendConformance(BackendConformance):
        backend = "mybackend"
        upstream_modules = ("myframework",)
        example_config = Path(__file__).parent / "tiny.yaml"
        smoke_overrides = ["train_iters=2"]

pytest then checks the adapter contract, the schema, that presets resolve and validate, that
the adapter and patch modules import without the upstream, and the lifecycle end to end.
"""

from primus.core.testing.conformance import BackendConformance

__all__ = ["BackendConformance"]
