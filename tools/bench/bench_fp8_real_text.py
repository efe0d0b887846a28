"""FP8 against bf16 on real text: the same Megatron recipe trained on a prepared corpus with a
held-out validation share, one variant per GPU at once, each variant's training and
validation losses side by side.

    cd tools/bench && uv run python bench_fp8_real_text.py --make-corpus /tmp/rt   # CPU, once
    python bench_fp8_real_text.py --corpus /tmp/rt/text --iters 300 --out fp8-real-text.json

The corpus is the text this machine has: the documentation, licences and changelogs under
/usr/share/doc and the Python sources of the installed packages, a byte-level BPE of 32,000
tokens trained on a quarter of it, prepared with `primus data prepare`.
Results: docs/benchmarks/fp8.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import environment

CONFIG = Path(__file__).parents[2] / "configs" / "megatron" / "llama3.2_1B-pretrain.yaml"
DISTRIBUTIONS = ("torch", "triton", "megatron-core", "primus-megatron", "primus-turbo-kernels")
SOURCES = ("/usr/share/doc", sys.prefix, "/usr/lib/python3")
VARIANTS = {
    "bf16": ["turbo.fp8=false"],
    "tensorwise": ["turbo.fp8=true"],
    "rowwise": ["turbo.fp8=true", "turbo.fp8_recipe=rowwise"],
    "delayed": ["turbo.fp8=true", "turbo.fp8_recipe=delayed"],
    "bf16-other-seed": ["turbo.fp8=false", "seed=1235"],  # how far two bf16 runs part
}
VALIDATION = re.compile(
    r"validation loss at iteration (\d+)( on validation set)? \| lm loss value: (\S+)"
)


def documents(limit: int) -> list[str]:
    """Up to `limit` characters of text files under SOURCES, in a fixed random order."""
    texts = []
    for root in SOURCES:
        for path in Path(root).rglob("*"):
            if path.is_symlink() or not path.is_file():
                continue
            try:
                if path.suffix == ".gz":
                    with gzip.open(path, "rt") as packed:
                        text = packed.read()
                elif path.suffix in (".py", ".txt", ".md", ".rst") or path.name == "copyright":
                    text = path.read_text()
                else:
                    continue
            except (OSError, UnicodeDecodeError, EOFError):
                continue
            if len(text) > 500:
                texts.append(text[:200_000])
    random.Random(0).shuffle(texts)
    kept, total = [], 0
    for text in texts:
        if total > limit:
            break
        kept.append(text)
        total += len(text)
    return kept


def make_corpus(folder: Path, chars: int) -> None:
    """FOLDER/corpus.jsonl, a BPE tokenizer in FOLDER/tokenizer, FOLDER/text.{bin,idx,json}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    texts = documents(chars)
    with open(folder / "corpus.jsonl", "w") as out:
        out.writelines(json.dumps({"text": text}) + "\n" for text in texts)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32_000, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator(texts[::4], trainer)
    (folder / "tokenizer").mkdir(exist_ok=True)
    tokenizer.save(str(folder / "tokenizer" / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config))
    subprocess.run(
        [sys.executable, "-m", "primus.cli", "data", "prepare", "-t", str(folder / "tokenizer"),
         "-o", str(folder / "text"), str(folder / "corpus.jsonl")],
        check=True,
    )  # fmt: skip


def train(name: str, gpu: int, corpus: str, iters: int, work: Path) -> subprocess.Popen[bytes]:
    """One variant on one GPU: the recipe on `corpus` (1% held out), evaluated every 100."""
    command = [
        sys.executable, "-m", "primus.cli", "train", "pretrain", "--config", str(CONFIG),
        f"data_path=[{corpus}]", "split=99,1,0", f"train_iters={iters}", "log_interval=10",
        "eval_interval=100", "eval_iters=10", "turbo.enable=true", *VARIANTS[name],
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu),
           "PRIMUS_WORKSPACE": str(work / name), "PRIMUS_EXP_NAME": name}  # fmt: skip
    print("$", " ".join(command), flush=True)
    with open(work / f"{name}.log", "wb") as log:  # the child keeps its own copy of the file
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def result(name: str, work: Path) -> dict[str, object]:
    """The variant's logged steps (loss, step seconds) and validation losses."""
    (metrics,) = (work / name).rglob("metrics.jsonl")
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    validation = {
        ("final" if m[2] else m[1]): float(m[3])
        for m in VALIDATION.finditer((work / f"{name}.log").read_text())
    }
    seconds = sorted(s["step_seconds"] for s in steps[3:])
    return {
        "loss": {s["step"]: s["loss"] for s in steps},
        "validation_loss": validation,
        "median_ms_per_iter": 1000 * seconds[len(seconds) // 2],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--make-corpus", type=Path, help="write the corpus here and stop")
    parser.add_argument("--chars", type=int, default=60_000_000, help="the corpus's size")
    parser.add_argument("--corpus", help="the prepared corpus's prefix")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--gpus", type=int, default=2, help="variants run this many at once")
    parser.add_argument("--out", type=Path, default=Path("fp8-real-text.json"))
    args = parser.parse_args()
    if args.make_corpus:
        make_corpus(args.make_corpus, args.chars)
        return
    work = Path(tempfile.mkdtemp(prefix="fp8rt"))
    for first in range(0, len(args.variants), args.gpus):
        wave = args.variants[first : first + args.gpus]
        runs = [train(name, gpu, args.corpus, args.iters, work) for gpu, name in enumerate(wave)]
        if any(run.wait() for run in runs):
            raise SystemExit(f"a run failed; see the logs in {work}")
    report = {**environment(DISTRIBUTIONS), "config": str(CONFIG.relative_to(CONFIG.parents[2])),
              "iters": args.iters, "variants": {n: result(n, work) for n in args.variants}}  # fmt: skip
    args.out.write_text(json.dumps(report, indent=1))
    for name, got in report["variants"].items():
        print(name, got["validation_loss"], f"{got['median_ms_per_iter']:.1f} ms/iter")


if __name__ == "__main__":
    main()
