"""Peak memory of `primus data prepare` as the corpus grows: the same generated corpus
(`bench_data_prepare.make_corpus`, whose tokenizer is the same at every size) at each size,
prepared with the default workers, the resident memory of the whole process tree (the command
and its workers, summed) sampled every 50 ms.

    cd tools/bench && uv run python bench_prepare_memory.py --mb 100 500 1000 2000 \\
        --out prepare-memory.json

Results: docs/benchmarks/data-prepare.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from bench_data_prepare import make_corpus
from common import environment


def peak_tree_rss(command: list[str], log: Path) -> tuple[float, int]:
    """Wall seconds of `command` and the largest sum of its process tree's resident bytes."""
    start, peak = time.perf_counter(), 0
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        root = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree))
            except psutil.NoSuchProcess:
                pass  # a worker ended between the listing and its reading
            time.sleep(0.05)
    if process.returncode:
        raise SystemExit(f"failed:\n{log.read_text()[-3000:]}")
    return time.perf_counter() - start, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[100, 500, 1000, 2000])
    parser.add_argument("--out", type=Path, help="write the JSON record here")
    args = parser.parse_args()
    rows = []
    for mb in args.mb:
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
            folder = Path(tmp)
            corpus, tokenizer = make_corpus(folder, mb)
            size = corpus.stat().st_size / 1e6
            command = [sys.executable, "-m", "primus.cli", "data", "prepare", "-i", str(corpus),
                       "-t", str(tokenizer), "-o", str(folder / "corpus")]  # fmt: skip
            seconds, peak = peak_tree_rss(command, folder / "log")
            tokens = (folder / "corpus.bin").stat().st_size
            rows.append({"corpus_mb": round(size, 1), "seconds": round(seconds, 1),
                         "mb_per_s": round(size / seconds, 2), "peak_rss_mib": round(peak / 2**20),
                         "bin_mb": round(tokens / 1e6, 1)})  # fmt: skip
            print(rows[-1], flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    print("| corpus MB | s | MB/s | peak RSS MiB (tree) |\n|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['corpus_mb']:,.0f} | {row['seconds']:.0f} | {row['mb_per_s']:.1f} | "
              f"{row['peak_rss_mib']:,} |")  # fmt: skip
    if args.out:
        cores = len(os.sched_getaffinity(0))
        record = environment(("primus-core", "tokenizers", "numpy"), device=f"CPU ({cores} cores)")
        args.out.write_text(json.dumps(record | {"runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
