"""`primus data prepare` against megatron-core's writer, on the same JSONL corpus and tokenizer.

    cd tools/bench && uv run python bench_data_prepare.py --mb 50 --out data-prepare.json

megatron-core's wheel does not ship Megatron-LM's tools/preprocess_data.py, so the reference is
the loop the former Megatron-only command ran (and preprocess_data.py runs with one worker):
the JSONL read in one process, batches of 1024 documents through the tokenizer's
`encode_batch` (its threads on every core), each document written through
megatron.core.datasets.indexed_dataset.IndexedDatasetBuilder. Each tool runs as a whole process
(the reference imports megatron-core, as that command did); the corpus (random words, 0.3-3 kB
documents) and a byte-level BPE tokenizer trained on its first MB are generated first. The
outputs must be byte-identical. Results: docs/benchmarks/data-prepare.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import environment

WORDS = [
    "".join(random.Random(i).choices("abcdefghijklmnopqrstuvwxyz", k=random.Random(-i).randint(2, 9)))
    for i in range(5000)
]  # fmt: skip
# The former command's loop, as a script: args corpus, tokenizer.json, prefix, EOD id.
REFERENCE = """
import json, sys, time, warnings
start = time.perf_counter()
warnings.filterwarnings("ignore")
from primus.backends.megatron.config.bridge import silence_import_notices
silence_import_notices()
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
from tokenizers import Tokenizer
corpus, tokenizer_file, prefix, eod = sys.argv[1:]
tokenizer = Tokenizer.from_file(tokenizer_file)
imported = time.perf_counter()
builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(tokenizer.get_vocab_size()))
def batches():
    texts = []
    for line in open(corpus, "rb"):
        if line.strip():
            texts.append(json.loads(line)["text"])
        if len(texts) == 1024:
            yield texts
            texts = []
    if texts:
        yield texts
for texts in batches():
    for encoding in tokenizer.encode_batch(texts):
        if encoding.ids:
            ids = [*encoding.ids, int(eod)]
            builder.add_document(ids, [len(ids)])
builder.finalize(prefix + ".idx")
print(json.dumps({"import_s": imported - start}))
"""


def make_corpus(folder: Path, megabytes: float) -> tuple[Path, Path]:
    """corpus.jsonl of about `megabytes` MB, and tokenizer/tokenizer.json trained on its start."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    corpus, size = folder / "corpus.jsonl", 0
    with corpus.open("w") as out:
        while size < megabytes * 1e6:
            text = " ".join(rng.choices(WORDS, k=rng.randint(50, 500)))
            line = json.dumps({"text": text}) + "\n"
            out.write(line)
            size += len(line)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=16000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    with corpus.open() as f:
        sample = [json.loads(line)["text"] for _, line in zip(range(600), f, strict=False)]
    tokenizer.train_from_iterator(sample, trainer)
    (folder / "tokenizer").mkdir()
    tokenizer.save(str(folder / "tokenizer" / "tokenizer.json"))
    return corpus, folder / "tokenizer"


def timed(command: list[str], log: Path) -> tuple[float, float, str]:
    """Wall and CPU seconds (user + system, of the process and its children) and the output."""
    print("$", " ".join(command[:3]), "...", flush=True)
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"failed:\n{log.read_text()[-3000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, log.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=50.0, help="corpus size in MB")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the JSON record here")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]  # other work on the machine slows the wall times, not the CPU's
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        folder = Path(tmp)
        corpus, tokenizer = make_corpus(folder, args.mb)
        mb = corpus.stat().st_size / 1e6
        runs: dict[str, list[tuple[float, float]]] = {}
        imports = []
        for repeat in range(args.repeats):
            ref = folder / f"ref{repeat}"
            command = [sys.executable, "-c", REFERENCE, str(corpus), str(tokenizer / "tokenizer.json"), str(ref), "0"]  # fmt: skip
            *measured, out = timed(command, folder / "log")
            runs.setdefault("megatron-core IndexedDatasetBuilder loop", []).append(
                (measured[0], measured[1])
            )
            imports.append(json.loads(out.splitlines()[-1])["import_s"])
            for workers in sorted({1, cores}):
                prefix = folder / f"primus{repeat}-{workers}"
                command = [sys.executable, "-m", "primus.cli", "data", "prepare", "-i", str(corpus),
                           "-t", str(tokenizer), "-o", str(prefix), "--workers", str(workers)]  # fmt: skip
                *measured, _ = timed(command, folder / "log")
                name = f"primus data prepare --workers {workers}"
                runs.setdefault(name, []).append((measured[0], measured[1]))
                for suffix in (".bin", ".idx"):
                    same = (
                        Path(f"{prefix}{suffix}").read_bytes()
                        == Path(f"{ref}{suffix}").read_bytes()
                    )
                    if not same:
                        raise SystemExit(f"{prefix}{suffix} differs from megatron-core's")

    def median(name: str, which: int) -> float:
        return statistics.median(run[which] for run in runs[name])

    reference = "megatron-core IndexedDatasetBuilder loop"
    base, base_cpu = median(reference, 0), median(reference, 1)
    work = base - statistics.median(imports)  # the reference without megatron-core's import
    summary: dict[str, Any] = {
        name: {
            "seconds": median(name, 0),
            "cpu_seconds": median(name, 1),
            "mb_per_s": mb / median(name, 0),
            "speedup": base / median(name, 0),
            "speedup_vs_reference_without_import": work / median(name, 0),
            "cpu_ratio": base_cpu / median(name, 1),
        }
        for name in runs
    }
    record = {
        **environment(
            ("primus-core", "megatron-core", "tokenizers", "numpy", "torch"),
            device=f"CPU ({cores} cores)",
        ),
        "corpus_mb": round(mb, 1),
        "load_average_1min_before_after": [load, os.getloadavg()[0]],
        "reference_import_s": statistics.median(imports),
        "byte_identical": True,
        "runs": summary,
    }
    print(
        f"corpus {mb:.1f} MB; megatron-core's import in the reference: {record['reference_import_s']:.1f} s"
    )
    print(
        "| tool | s | MB/s | x reference | x reference less its import | CPU s | x reference CPU |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in summary.items():
        cells = (
            f"{row['seconds']:.1f} | {row['mb_per_s']:.1f} | {row['speedup']:.2f} | "
            f"{row['speedup_vs_reference_without_import']:.2f} | {row['cpu_seconds']:.1f} | "
            f"{row['cpu_ratio']:.2f}"
        )
        print(f"| {name} | {cells} |")
    if args.out:
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
