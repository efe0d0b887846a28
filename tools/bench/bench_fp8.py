"""FP8 against bf16 in one run: the GEMMs of Llama 3.2 1B through `fp8_linear` against the
bf16 matmul, then the 1B Megatron recipe with turbo on, bf16 against `turbo.fp8` (tensorwise,
rowwise).

    python tools/bench/bench_fp8.py --config configs/megatron/llama3.2_1B-pretrain.yaml \
        --iters 30 --warmup 10 --out fp8.json

The GEMMs: each linear layer of a 1B block at 4096 tokens (sequence 4096, micro-batch 1),
forward and backward (three GEMMs), launched eagerly and timed with CUDA events (median of
`--reps` after warm-up), the weight's FP8 copy cached as in training (`cache_weight`, the copy
made once per step) and not. Eager FP8 launches some twenty kernels for a forward and backward
where bf16 launches three, so the CPU can bound these times; the training runs replay each
iteration as a CUDA graph (turbo's `cuda_graphs`), which takes the launches away. The training
runs: tools/bench/bench_megatron_variants.py with the three variants (step time, tokens/s, loss
curve against bf16). Prints Markdown tables, writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from common import cuda_median_ms, environment, run

HERE = Path(__file__).resolve().parent
TOKENS = 4096
# (name, in, out) of Llama 3.2 1B's linear layers: hidden 2048, 32 heads, 8 KV groups, FFN 8192.
SHAPES = (("qkv", 2048, 3072), ("proj", 2048, 2048), ("fc1", 2048, 16384), ("fc2", 8192, 2048))
VARIANTS = {
    "bf16": ["turbo.enable=true"],
    "fp8_tensorwise": ["turbo.enable=true", "turbo.fp8=true"],
    "fp8_rowwise": ["turbo.enable=true", "turbo.fp8=true", "turbo.fp8_recipe=rowwise"],
}


def backward(forward: Callable[[], Any], inputs: tuple[Any, ...], grad: Any) -> Any:
    """One forward and backward of `forward()`: the gradients of `inputs`."""
    import torch

    return torch.autograd.grad(forward(), inputs, grad)


def gemms(reps: int) -> dict[str, dict[str, float]]:
    """ms of forward + backward per layer: bf16, and each recipe with and without the cache."""
    import torch
    import torch.nn.functional as F

    from primus.turbo.kernels.fp8_linear import fp8_linear

    results = {}
    for name, k, n in SHAPES:
        x = torch.randn(TOKENS, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.nn.Parameter(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5)
        grad = torch.randn(TOKENS, n, device="cuda", dtype=torch.bfloat16)
        ways = {"bf16": partial(F.linear, x, w)}
        for recipe in ("tensorwise", "rowwise"):
            for cache in (True, False):
                label = f"fp8_{recipe}" + ("" if cache else "_uncached")
                ways[label] = partial(fp8_linear, x, w, None, recipe, cache)
        row = {
            label: cuda_median_ms(partial(backward, f, (x, w), grad), reps)
            for label, f in ways.items()
        }
        row["tflops_bf16"] = 6 * TOKENS * k * n / row["bf16"] / 1e9
        row |= {f"{label}_speedup": row["bf16"] / row[label] for label in ways if label != "bf16"}
        results[name] = row
        del x, w, grad
    torch.cuda.empty_cache()  # the training runs need the memory
    return results


def print_gemms(gemm_rows: dict[str, dict[str, float]]) -> None:
    """A Markdown table: bf16 ms and TFLOP/s per layer, each FP8 way's speed-up."""
    ways = [k.removesuffix("_speedup") for k in gemm_rows["qkv"] if k.endswith("_speedup")]
    print("| layer | bf16 ms | bf16 TFLOP/s | " + " | ".join(ways) + " |")
    print("|---" * (len(ways) + 3) + "|")
    for name, row in gemm_rows.items():
        cells = [f"{row['bf16']:.3f}", f"{row['tflops_bf16']:.0f}"]
        cells += [f"{row[f'{way}_speedup']:.2f}x" for way in ways]
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("fp8.json"))
    opts = parser.parse_args()
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = environment(
        ("torch", "triton", "megatron-core", "primus-turbo-kernels")
    )
    report["command"] = " ".join(sys.argv)
    report["gemms"] = gemms(opts.reps)
    print_gemms(report["gemms"])
    opts.out.write_text(json.dumps(report, indent=2))  # kept should the training runs fail
    training = opts.out.with_name(opts.out.stem + "-training.json")
    command = [sys.executable, str(HERE / "bench_megatron_variants.py"), "--config",
               str(opts.config), "--iters", str(opts.iters), "--warmup", str(opts.warmup),
               "--out", str(training)]  # fmt: skip
    for name, overrides in VARIANTS.items():
        command += ["--variant", name, *overrides]
    print(run(command, opts.out.with_name(opts.out.stem + "-training.log"))[-2000:])
    report["training"] = json.loads(training.read_text())
    opts.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
