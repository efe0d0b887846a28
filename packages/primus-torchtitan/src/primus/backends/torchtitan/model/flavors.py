"""Model flavors from Primus presets, registered with TorchTitan's own model registries.

TorchTitan's model dimensions are not settable from its CLI: each family keeps a dict of flavor
builders (`torchtitan.models.llama3.llama3_configs`, ...). A Primus model preset's `model:`
section describes the dimensions; `register_flavor` adds a builder under the preset's name and
returns TorchTitan's `ModelSpec` for it. The builders reuse each family's layer builders (private
in torchtitan 0.3, hence the version gate of the patch set), so the weights are initialised
exactly as TorchTitan's own flavors are.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any

from primus.core.config import ModuleConfig, ParamSpec

MODEL_KEYS = {
    "model.family": ParamSpec(
        str, "TorchTitan model family: llama3 or qwen3", choices=("llama3", "qwen3")
    ),
    "model.dim": ParamSpec(int, "hidden size"),
    "model.n_layers": ParamSpec(int, "transformer layers"),
    "model.n_heads": ParamSpec(int, "attention heads"),
    "model.n_kv_heads": ParamSpec(int, "key/value heads (GQA)"),
    "model.head_dim": ParamSpec(int, "per-head size (qwen3; default dim / n_heads)"),
    "model.ffn_hidden_dim": ParamSpec(int, "SwiGLU hidden size"),
    "model.vocab_size": ParamSpec(int, "vocabulary size"),
    "model.rope_theta": ParamSpec(float, "RoPE base"),
    "model.rope_scaling": ParamSpec(
        str,
        "llama3: Llama-3 frequency scaling ('llama') or none",
        choices=("llama", "none"),
        default="llama",
    ),
    "model.rope_scaling_factor": ParamSpec(
        float,
        "Llama-3 scaling factor (rope_scaling.factor in HF config.json; TorchTitan: 8)",
        default=8.0,
    ),
    "model.max_seq_len": ParamSpec(int, "RoPE table length"),
    "model.tie_embeddings": ParamSpec(
        bool, "share the embedding and output weights", default=False
    ),
    "model.attn_backend": ParamSpec(
        str,
        "TorchTitan attention: flex, flex_flash or varlen (each row's documents masked from each "
        "other), or sdpa (causal over the whole row, as Megatron's default: PyTorch's SDPA)",
        choices=("flex", "flex_flash", "varlen", "sdpa"),
    ),
    "model.float8": ParamSpec(bool, "float8 linears (torchao), TorchTitan's Float8LinearConverter"),
}
REQUIRED = ("family", "dim", "n_layers", "n_heads", "vocab_size", "ffn_hidden_dim")


def _llama3(m: dict[str, Any]) -> Callable[..., Any]:
    from torchtitan.models import llama3
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    dim, tied = m["dim"], bool(m.get("tie_embeddings", False))

    def build(attn_backend: str, tp_gemm_backend: str = "default") -> Any:
        return llama3.Llama3Model.Config(
            dim=dim,
            vocab_size=m["vocab_size"],
            enable_weight_tying=tied,
            tok_embeddings=Embedding.Config(
                num_embeddings=m["vocab_size"],
                embedding_dim=dim,
                param_init=llama3._EMBEDDING_SKIP_INIT if tied else llama3._EMBEDDING_INIT,
            ),
            norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
            lm_head=Linear.Config(
                in_features=dim,
                out_features=m["vocab_size"],
                param_init=llama3._output_linear_init(dim),
            ),
            layers=llama3._build_llama3_layers(
                n_layers=m["n_layers"],
                dim=dim,
                n_heads=m["n_heads"],
                n_kv_heads=m.get("n_kv_heads"),
                hidden_dim=m["ffn_hidden_dim"],
                rope=ComplexRoPE.Config(
                    dim=dim // m["n_heads"],
                    max_seq_len=m.get("max_seq_len", 131072),
                    theta=m.get("rope_theta", 500000.0),
                    scaling=m.get("rope_scaling", "llama"),
                    scaling_factor=float(m.get("rope_scaling_factor", 8.0)),
                ),
                attn_backend=attn_backend,
                tp_gemm_backend=tp_gemm_backend,
            ),
        )

    return build


def _qwen3(m: dict[str, Any]) -> Callable[..., Any]:
    from torchtitan.models import qwen3
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear

    dim, tied = m["dim"], bool(m.get("tie_embeddings", False))
    head_dim = m.get("head_dim") or dim // m["n_heads"]

    def build(attn_backend: str, **_: Any) -> Any:
        return qwen3.Qwen3Model.Config(
            dim=dim,
            vocab_size=m["vocab_size"],
            enable_weight_tying=tied,
            norm=qwen3._qwen3_norm(dim),
            tok_embeddings=Embedding.Config(
                num_embeddings=m["vocab_size"],
                embedding_dim=dim,
                param_init=qwen3._EMBEDDING_SKIP_INIT if tied else qwen3._EMBEDDING_INIT,
            ),
            lm_head=Linear.Config(
                in_features=dim, out_features=m["vocab_size"], param_init=qwen3._LINEAR_INIT
            ),
            layers=qwen3._build_qwen3_layers(
                n_layers=m["n_layers"],
                dim=dim,
                n_heads=m["n_heads"],
                n_kv_heads=m.get("n_kv_heads") or m["n_heads"],
                head_dim=head_dim,
                hidden_dim=m["ffn_hidden_dim"],
                attn_backend=attn_backend,
                rope=CosSinRoPE.Config(
                    dim=head_dim,
                    max_seq_len=m.get("max_seq_len", 40960),
                    theta=float(m.get("rope_theta", 1000000.0)),
                ),
            ),
        )

    return build


FAMILIES: dict[str, Callable[[dict[str, Any]], Callable[..., Any]]] = {
    "llama3": _llama3,
    "qwen3": _qwen3,
}


def _causal_over_rows(build: Callable[..., Any]) -> Callable[..., Any]:
    """The family's builder, with `attn_backend="sdpa"` too: TorchTitan's maskless
    ScaledDotProductAttention (is_causal; cuDNN's or FlashAttention's kernel) in every layer.
    TorchTitan builds no document masks for it: a row's documents attend to those before them,
    as in Megatron without reset_attention_mask. TorchTitan's own choices refuse it for
    language models, which always have positions to mask documents by."""

    def built(attn_backend: str, **kwargs: Any) -> Any:
        if attn_backend != "sdpa":
            return build(attn_backend, **kwargs)
        from torchtitan.models.common.attention import ScaledDotProductAttention

        config = build("flex", **kwargs)
        for layer in config.layers:
            if layer.attention is not None:
                layer.attention.inner_attention = ScaledDotProductAttention.Config()
        return config

    return built


def check_model(config: ModuleConfig) -> None:
    """A ConfigError naming the model dimensions no preset or key sets (`model: null`, or a
    dimension set to null), at the first one's line."""
    model = config.params.get("model") or {}
    missing = [f"model.{key}" for key in REQUIRED if model.get(key) is None]
    if missing:
        raise config.error(
            missing[0],
            f"missing {', '.join(missing)}",
            hint=f"set {', '.join(missing)}, or name a model preset that sets them (model: "
            "llama3.2_1B, ...); see docs/backends/torchtitan.md",
        )


def register_flavor(config: ModuleConfig, compile_model: bool = False) -> Any:
    """Register the `model:` section as a flavor named after the model; return its ModelSpec."""
    check_model(config)
    model = config.params["model"]
    name = config.params.get("model_name") or f"primus_{model['family']}"
    family = model["family"]
    module = importlib.import_module(f"torchtitan.models.{family}")
    getattr(module, f"{family}_configs")[name] = _causal_over_rows(FAMILIES[family](model))
    converters = None
    if model.get("float8"):
        if importlib.util.find_spec("torchao") is None:
            raise config.error(
                "model.float8",
                "model.float8 needs torchao, which is not installed",
                hint="pip install torchao (not a dependency of primus-torchtitan); or, with "
                "primus-turbo-kernels, turbo.enable: true trains turbo's FP8 linears instead; "
                "or set model.float8: false",
            )
        from torchtitan.components.quantization import Float8LinearConverter

        converters = [Float8LinearConverter.Config(model_compile_enabled=compile_model)]
    if config.peft is not None:  # `peft:` (fine-tuning): TorchTitan's LoRAConverter
        from primus.backends.torchtitan.posttrain.lora import converter

        converters = [*(converters or []), converter(config.peft)]
    return module.model_registry(
        name, attn_backend=model.get("attn_backend", "flex"), converters=converters
    )
