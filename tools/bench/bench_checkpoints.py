"""HF checkpoint import and export per backend: wall time and peak host RSS, against
`transformers.AutoModelForCausalLM.from_pretrained` of the same directory in the same run.

    python tools/bench/bench_checkpoints.py --model llama3.2_3B --backends megatron torchtitan maxtext

Writes a random bf16 HF checkpoint of the published config's shape (one safetensors file per
layer, as published checkpoints are sharded), derives each backend's preset from it, then
times `primus checkpoint import` and `primus checkpoint export` as whole processes. Goals:
peak RSS <= 1.3x the model's bytes (one process holds the whole model here),
time <= 2x transformers' load. Results: docs/benchmarks/checkpoints.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import device_label, environment, print_table

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
# the key that sets the dtype an export writes (Megatron writes its params' dtype)
EXPORT_DTYPE_KEYS = {"torchtitan": "checkpoint.export_dtype", "maxtext": "export_dtype"}
COLUMNS = (
    ("seconds", "seconds", ".1f"),
    ("x transformers", "time_vs_transformers", ".2f"),
    ("peak RSS GiB", "peak_rss_gib", ".2f"),
    ("x model bytes", "rss_vs_model", ".2f"),
)


def measure(command: list[str], log: Path) -> dict[str, Any]:
    """Wall seconds and peak RSS (GiB) of `command` as one process tree (wait4's rusage);
    a failed command gives its exit code and log tail, and the report goes on."""
    print("$", " ".join(command), flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    result = {"seconds": round(wall, 2), "peak_rss_gib": round(usage.ru_maxrss * 1024 / GIB, 2)}
    if code := os.waitstatus_to_exitcode(status):
        print(f"failed (exit {code}); see {log}:\n{log.read_text()[-3000:]}", flush=True)
        result |= {"exit_code": code, "log_tail": log.read_text()[-1500:]}
    return result


def experiment(backend: str, hf: Path, work: Path, recipe_name: str) -> Path:
    """The backend's recipe `recipe_name` (configs/<backend>/) with the model derived from
    `hf`."""
    preset = work / f"{backend}-model.yaml"
    subprocess.run([sys.executable, "-m", "primus.cli", "checkpoint", "preset", "--hf", str(hf),
                    "--framework", backend, "--out", str(preset)], check=True, cwd=ROOT)  # fmt: skip
    recipe = (ROOT / "configs" / backend / f"{recipe_name}.yaml").read_text()
    exp = work / f"{backend}.yaml"
    exp.write_text(re.sub(r"(?m)^(\s+model:) \S+$", rf"\1 {preset}", recipe))
    return exp


def make_model(hf: Path, model: str) -> Path:
    """A random bf16 HF model of `model`'s published shape in `hf`, made by a child process: a
    child's peak RSS (wait4) starts at this process's own peak (fork and exec carry the
    high-water mark over), so this process never holds tensors."""
    make = ("import sys; from pathlib import Path; from primus.testing.hf_models import "
            "make_published_model; make_published_model(Path(sys.argv[1]), sys.argv[2])")  # fmt: skip
    subprocess.run([sys.executable, "-c", make, str(hf), model], check=True, cwd=ROOT)
    return hf


def tensor_bytes(hf: Path) -> int:
    """The bytes of an HF model's tensors, from its safetensors headers."""
    from primus.core.checkpoint.hf import DTYPE_BYTES, safetensors_files, safetensors_header

    return sum(
        DTYPE_BYTES[entry["dtype"]] * math.prod(entry["shape"])
        for path in safetensors_files(hf)
        for entry in safetensors_header(path).values()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3.2_3B", help="a key of hf_models.HF_CONFIGS")
    parser.add_argument("--backends", nargs="+", default=["megatron", "torchtitan", "maxtext"])
    parser.add_argument(
        "--recipe",
        default="llama3.2_1B-pretrain",
        help="configs/<backend>/<RECIPE>.yaml, its model replaced (tiny-cpu on a CPU machine)",
    )
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: stdout)")
    parser.add_argument(
        "--hf", type=Path, default=None, help="an HF model an earlier run made (default: make one)"
    )
    parser.add_argument(
        "--export-dtype",
        default=None,
        help="the dtype exports write, where the backend has the key (default: its own)",
    )
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    work.mkdir(parents=True, exist_ok=True)
    hf = args.hf or make_model(work / "hf", args.model)
    model_bytes = tensor_bytes(hf)
    load = [sys.executable, "-c", "import sys; from transformers import AutoModelForCausalLM; "
            "AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype='auto')", str(hf)]  # fmt: skip
    results: dict[str, Any] = {"transformers.from_pretrained": measure(load, work / "hf.log")}
    primus = [sys.executable, "-m", "primus.cli", "checkpoint"]
    for backend in args.backends:
        exp = ["--config", str(experiment(backend, hf, work, args.recipe)), f"workspace={work / 'runs'}",
               f"exp_name=bench-{backend}"]  # fmt: skip
        results[f"{backend} import"] = measure(
            [*primus, "import", "--hf", str(hf), *exp], work / f"{backend}-import.log"
        )
        dtype = [f"{EXPORT_DTYPE_KEYS[backend]}={args.export_dtype}"] if (
            args.export_dtype and backend in EXPORT_DTYPE_KEYS) else []  # fmt: skip
        results[f"{backend} export"] = measure(
            [*primus, "export", "--hf", str(work / f"out-{backend}"), *exp, *dtype],
            work / f"{backend}-export.log",
        )
    reference = results["transformers.from_pretrained"]["seconds"]
    for values in results.values():
        values["time_vs_transformers"] = round(values["seconds"] / reference, 2)
        values["rss_vs_model"] = round(values["peak_rss_gib"] * GIB / model_bytes, 2)
    device = device_label()
    distributions = (
        "primus-core",
        "torch",
        "transformers",
        "megatron-core",
        "torchtitan",
        "maxtext",
        "jax",
        "orbax-checkpoint",
        "tensorstore",
    )
    report = {
        **environment(distributions, device),
        "model": args.model,
        "model_gib": round(model_bytes / GIB, 2),
        "export_dtype": args.export_dtype,
        "results": results,
    }
    text = json.dumps(report, indent=2)
    (args.out.write_text(text + "\n") if args.out else print(text))
    print_table(results, COLUMNS, "goals: time <= 2x transformers, peak RSS <= 1.3x model bytes")


if __name__ == "__main__":
    main()
