"""Attention over one packed row, forward and backward, at Llama 3.2 1B's layout: causal flash
(what pretraining runs) against the kernels that take the rows' block-diagonal mask.

    python tools/bench/bench_packed_attention.py --seq 4096 --reps 20

One row of `--seq` tokens holding documents of 60 to 1,000 tokens (seeded), 32 query heads of
64; `--kv-heads 32` for no GQA (SDPA's masked kernels take none), 8 for the model's. Each
kernel: three untimed calls, then the median of `--reps` (CUDA events around each). Flex runs
compiled, with its block mask made by compiled `create_block_mask` (timed apart). Needs a GPU.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from common import cuda_median_ms
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    s, groups = args.seq, args.heads // args.kv_heads
    lengths: list[int] = []
    while sum(lengths) < s:
        lengths.append(int(torch.randint(60, 1000, ()).item()))
    lengths[-1] -= sum(lengths) - s
    segments = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).cuda()
    causal = torch.ones(s, s, dtype=torch.bool, device="cuda").tril()
    attended = (segments[:, None] == segments[None, :]) & causal  # [s, s]

    def leaf(heads: int) -> torch.Tensor:  # Megatron's [s, b, h, d], seen as [b, h, s, d]
        x = torch.randn(s, 1, heads, args.head_dim, device="cuda", dtype=torch.bfloat16)
        return x.requires_grad_()

    q0, k0, v0 = leaf(args.heads), leaf(args.kv_heads), leaf(args.kv_heads)
    grad = torch.randn(1, args.heads, s, args.head_dim, device="cuda", dtype=torch.bfloat16)

    def step(attention: Callable[..., torch.Tensor]) -> Callable[[], None]:
        def go() -> None:
            q, k, v = (x.permute(1, 2, 0, 3) for x in (q0, k0, v0))
            attention(q, k, v).backward(grad)

        return go

    def masked_sdpa(backend: SDPBackend) -> Callable[..., torch.Tensor]:
        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attended)

        return attention

    def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
        return attended[q_idx, kv_idx]

    make_block_mask = torch.compile(create_block_mask)
    block_mask = make_block_mask(mask_mod, 1, None, s, s, device="cuda")
    flex = torch.compile(flex_attention)
    gqa = groups > 1
    kernels: dict[str, Callable[..., torch.Tensor]] = {
        "flash, causal (pretraining)": lambda q, k, v: F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=gqa
        ),
        "SDPA memory-efficient, masked": masked_sdpa(SDPBackend.EFFICIENT_ATTENTION),
        "SDPA cuDNN, masked": masked_sdpa(SDPBackend.CUDNN_ATTENTION),
        "FlexAttention, block mask": lambda q, k, v: flex(
            q, k, v, block_mask=block_mask, enable_gqa=gqa
        ),
    }
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; one row of {s} tokens, "
          f"{len(lengths)} documents, {args.heads} query / {args.kv_heads} key-value heads")  # fmt: skip
    make = lambda: make_block_mask(mask_mod, 1, None, s, s, device="cuda")  # noqa: E731
    print(
        f"{'block mask (compiled create_block_mask)':<40} {cuda_median_ms(make, args.reps):8.3f} ms"
    )
    for name, attention in kernels.items():
        try:
            print(
                f"{name:<40} {cuda_median_ms(step(attention), args.reps):8.3f} ms forward+backward"
            )
        except RuntimeError as error:  # a kernel this GPU or torch does not have
            print(f"{name:<40} not run: {str(error).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
