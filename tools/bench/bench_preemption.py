"""Preemption on a GPU: a stop signal (SIGTERM by default) to a real `primus train` (the process
started, every process of the run, or one rank) in the middle of a run, timed, then the
resume by running the same command again.

    python tools/bench/bench_preemption.py --config configs/megatron/llama3.2_1B-pretrain.yaml \
        --at-step 20 train_iters=40 log_interval=1 save_interval=1000 --out preemption.json

Overrides after the options go to both runs (they must log every step, save checkpoints, and
run well past `--at-step`). Measured: seconds from the signal to the run dir's preempted.json
(the step in flight finished and the checkpoint written) and to the exit, the checkpoint's size
and its write rate (size over the seconds to the marker: a lower bound), then the resumed run's
first and last step and its whole time. Results: docs/benchmarks/reliability.md.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from common import environment

from primus.testing.faults import interrupt, steps_logged
from primus.testing.runs import primus, step_metrics


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--at-step", type=int, default=20)
    parser.add_argument("--work", type=Path, default=Path("/tmp/primus-preemption"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--signal", default="SIGTERM", help="SIGTERM, SIGINT or SIGUSR1")
    parser.add_argument(
        "--to", default="launcher", help="launcher (the process started), everyone, or a rank"
    )
    args, overrides = parser.parse_known_args()
    sig = signal.Signals[args.signal]
    to = None if args.to == "launcher" else args.to if args.to == "everyone" else int(args.to)
    command = ["train", "pretrain", "--config", str(args.config), "exp_name=preempt", *overrides]
    env = {"PRIMUS_WORKSPACE": str(args.work)}
    run_dir = args.work / "local" / "local" / "preempt"

    start = time.monotonic()
    stopped = interrupt(command, run_dir, sig, at_step=args.at_step, to_rank=to, env=env)
    signalled, marker = stopped.signalled_at, stopped.marker
    if not stopped.preempted or marker is None:
        sys.exit(f"not preempted (exit {stopped.returncode}):\n{stopped.stderr[-3000:]}")
    to_marker = marker["time"] - signalled
    checkpoint = Path(marker["checkpoint"])
    size = folder_bytes(checkpoint)
    print(f"preempted at step {marker['step']} (signal after step {args.at_step}): marker after "
          f"{to_marker:.1f} s, exit {stopped.returncode} after {stopped.ended_at - signalled:.1f} s; "
          f"checkpoint {size / 2**30:.2f} GiB, >= {size / 1e9 / to_marker:.2f} GB/s")  # fmt: skip

    first_run_steps = len(step_metrics(run_dir))
    again = time.time()
    resumed = primus(*command, **env)
    if resumed.returncode:
        sys.exit(f"the resume failed (exit {resumed.returncode}):\n{resumed.stderr[-3000:]}")
    steps = [m["step"] for m in step_metrics(run_dir)[first_run_steps:]]
    print(f"resumed: steps {steps[0]}-{steps[-1]}; whole resume {time.time() - again:.1f} s")
    report = {
        **environment(("primus-core", "torch", "megatron-core", "torchtitan", "maxtext", "jax")),
        "command": ["primus", *command],
        "signal": sig.name,
        "signal_to": args.to,
        "signal_after_step": args.at_step,
        "processes_left_after_5_s": len(stopped.left),
        "preempted_at_step": marker["step"],
        "signal_to_checkpoint_s": round(to_marker, 2),
        "signal_to_exit_s": round(stopped.ended_at - signalled, 2),
        "exit_code": stopped.returncode,
        "checkpoint_gib": round(size / 2**30, 3),
        "checkpoint_write_gb_per_s_at_least": round(size / 1e9 / to_marker, 3),
        "resumed_steps": [steps[0], steps[-1]],
        "resume_whole_s": round(time.time() - again, 1),
        "bench_whole_s": round(time.monotonic() - start, 1),
        "last_step_logged": steps_logged(run_dir),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
