"""qwix's LoRA provider, the adapted projection's output kept in the projection's own dtype.

qwix adds (alpha / rank) x A B to the projection's output with A and B as MaxText holds its
parameters (float32), which promotes a bfloat16 output to float32: with LoRA on `v_proj`,
MaxText's GPU flash attention then refuses q, k and v of two dtypes. The sum is cast back to
the dtype the projection computes in (its `preferred_element_type`, else its operands')."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import qwix  # type: ignore[import-untyped]


def _dtype(*operands: Any, preferred: Any = None) -> Any:
    return preferred or jnp.result_type(*(getattr(o, "dtype", o) for o in operands))


class LoraProvider(qwix.LoraProvider):  # type: ignore[misc]
    """`qwix.LoraProvider` whose adapted outputs keep the projection's dtype."""

    def dot_general(
        self,
        lhs: Any,
        rhs: Any,
        dimension_numbers: Any,
        precision: Any = None,
        preferred_element_type: Any = None,
        out_sharding: Any = None,
    ) -> Any:
        out = super().dot_general(lhs, rhs, dimension_numbers, precision,
                                  preferred_element_type, out_sharding=out_sharding)  # fmt: skip
        return out.astype(_dtype(lhs, rhs, preferred=preferred_element_type))

    def einsum(self, einsum_str: str, *operands: Any, **kwargs: Any) -> Any:
        out = super().einsum(einsum_str, *operands, **kwargs)
        return out.astype(_dtype(*operands, preferred=kwargs.get("preferred_element_type")))
