"""How long the front door takes: each command a new process, several times, the median wall
and CPU seconds, beside `primus --version` in the same run.

    uv run python tools/bench/cli_latency.py [--repeats 5] [--out report.json]

The commands: `--help`, `config validate` of each backend's tiny recipe (with the parameter
schemas cached, after one unmeasured run of every command; and of the quickstart with an empty
cache, as the first check after an install, and with `--full`), a dry run of the quickstart,
`slurm --dry-run`, `checkpoint preset` of a tiny HF model, completion of an override, and four
bad inputs that must fail in seconds (a missing Megatron corpus, a workspace under a file, a
dry run of two nodes without an address, a bad line of SFT data). Each has the exit it should
have; the table shows the exit each had (another tree, `--label before`, may differ).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import environment

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
SFT = ROOT / "configs" / "megatron" / "sft-tiny-cpu.yaml"
PRIMUS = [sys.executable, "-m", "primus.cli"]
EMPTY = "<a new empty folder>"  # PRIMUS_CACHE_DIR for a run that finds no cached schema


def cases(folder: Path) -> dict[str, tuple[list[str], int, dict[str, str]]]:
    """name -> (primus arguments, expected exit code, extra environment)."""
    from primus.testing.hf_models import make_hf_model
    from primus.testing.sft_data import write_tokenizer
    from primus.testing.sft_runs import sft_experiment

    hf = make_hf_model(folder / "hf", "llama3")
    write_tokenizer(hf)
    bad = folder / "bad.jsonl"
    chat = '{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}'
    bad.write_text("\n".join([chat] * 6 + [chat[:-3]]) + "\n")
    sft = sft_experiment(SFT, folder / "sft", {"hf": hf, "chat_train": bad, "chat_eval": bad})
    (folder / "a-file").write_text("x")
    complete = {"_PRIMUS_COMPLETE": "complete_bash", "COMP_CWORD": "5",
                "COMP_WORDS": f"primus train pretrain --config {QUICKSTART} train_i"}  # fmt: skip
    return {
        "primus --version": (["--version"], 0, {}),
        "primus --help": (["--help"], 0, {}),
        "config validate (quickstart)": (["config", "validate", QUICKSTART], 0, {}),
        **{
            f"config validate ({backend} tiny-cpu)": (
                ["config", "validate", str(ROOT / "configs" / backend / "tiny-cpu.yaml")],
                0,
                {},
            )
            for backend in ("torchtitan", "maxtext")
        },
        "config validate (quickstart), empty cache": (
            ["config", "validate", QUICKSTART],
            0,
            {"PRIMUS_CACHE_DIR": EMPTY},
        ),
        "config validate --full (quickstart)": (
            ["config", "validate", "--full", QUICKSTART],
            0,
            {},
        ),
        "train --dry-run (quickstart)": (
            ["train", "pretrain", "--dry-run", "--config", QUICKSTART],
            0,
            {},
        ),
        "slurm --dry-run, 2 nodes": (
            ["slurm", "pretrain", "--dry-run", "--config", QUICKSTART, "--nnodes", "2"],
            0,
            {},
        ),
        "checkpoint preset (megatron)": (
            ["checkpoint", "preset", "--hf", str(hf), "--framework", "megatron"],
            0,
            {},
        ),
        "completion of an override": ([], 0, complete),
        "bad: missing data_path": (
            ["train", "pretrain", "--config", QUICKSTART, f"data_path=[{folder / 'none'}]"],
            2,
            {},
        ),
        "bad: workspace under a file": (
            ["train", "pretrain", "--config", QUICKSTART],
            2,
            {"PRIMUS_WORKSPACE": str(folder / "a-file" / "ws")},
        ),
        "bad: 2 nodes, no address (dry run)": (
            ["train", "pretrain", "--dry-run", "--config", QUICKSTART, "--nnodes", "2"],
            2,
            {},
        ),
        "bad: SFT line 7 (posttrain)": (["train", "posttrain", "--config", str(sft)], 2, {}),
    }


def timed(args: list[str], env: dict[str, str], workspace: Path) -> tuple[float, float, int]:
    """One run: wall seconds, CPU seconds of the process and its children, exit code."""
    if env.get("PRIMUS_CACHE_DIR") == EMPTY:
        env = {**env, "PRIMUS_CACHE_DIR": tempfile.mkdtemp(dir=workspace.parent)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [*PRIMUS, *args],
        capture_output=True,
        env={**os.environ, "PRIMUS_WORKSPACE": str(workspace), **env},
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--label", default="this tree")
    parser.add_argument("--out", type=Path)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        os.environ["PRIMUS_CACHE_DIR"] = str(folder / "cache")
        rows = {}
        commands = cases(folder)
        for args, _, env in commands.values():  # fills the schema cache
            timed(args, env, folder / "ws")
        for name, (args, expected, env) in commands.items():
            runs = [timed(args, env, folder / "ws") for _ in range(options.repeats)]
            rows[name] = {
                "wall_s": statistics.median(r[0] for r in runs),
                "cpu_s": statistics.median(r[1] for r in runs),
                "exit": runs[-1][2],
                "expected_exit": expected,
            }
    base = rows["primus --version"]["wall_s"]
    print(f"| command ({options.label}) | exit | wall s | CPU s | x --version |")
    print("|---|---|---:|---:|---:|")
    for name, row in rows.items():
        code = f"{row['exit']}" + ("" if row["exit"] == row["expected_exit"] else
                                    f" (should be {row['expected_exit']})")  # fmt: skip
        print(f"| {name} | {code} | {row['wall_s']:.2f} | {row['cpu_s']:.2f} | "
              f"{row['wall_s'] / base:.1f} |")  # fmt: skip
    report = {**environment(("primus-core", "megatron-core", "torch"), f"CPU ({os.cpu_count()} cores)"),
              "label": options.label, "repeats": options.repeats, "rows": rows}  # fmt: skip
    if options.out:
        options.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
