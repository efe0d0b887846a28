"""Test-only faults for test_reliability.py: patches that Primus's runs pick up when this module
is imported at interpreter start (a sitecustomize.py on PYTHONPATH that imports it, so that
every process of a run, torchrun's workers too, has them), and a driver that runs a command
again and again, each time in a new process, killed at another point of a save:

    python -c "import faulty; faulty.run_each(KILLS, OUT_DIR, ARGV)"

Each fault is a patch registered here, on when its environment variable is set:

    PRIMUS_TEST_NAN_LOSS=4,6   a forward hook multiplies the model's output by NaN at steps 4
                               and 6: the loss and, through the backward, the gradients are NaN
    PRIMUS_TEST_INF_GRAD=7     a hook on the output's gradient multiplies it by Inf at step 7:
                               the loss stays finite, the gradient norm does not
    PRIMUS_TEST_KILL_AT=S:E    the process sends itself SIGKILL at the E-th file operation of
                               its S-th checkpoint save (opening a file for writing, writing one
                               item into it, renaming .metadata.tmp; E past the last: right
                               after the save returned)
    PRIMUS_TEST_SAVE_OPS=FILE  each save appends its number of file operations to FILE
    PRIMUS_TEST_DATA_LOG=1     each rank appends to the run dir's reads-rank{R}.txt the epoch
                               and the `id` of each dataset row it reads, and to
                               batches-rank{R}.txt the step and a hash of each batch's tokens
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from primus.core.patches import PatchContext, register_patch


def _steps(name: str) -> set[int]:
    return {int(s) for s in os.environ.get(name, "").split(",") if s}


@register_patch(
    "test.nonfinite",
    backend="torchtitan",
    phase="before_train",
    condition=lambda ctx: bool(_steps("PRIMUS_TEST_NAN_LOSS") | _steps("PRIMUS_TEST_INF_GRAD")),
)
def nonfinite(ctx: PatchContext) -> None:
    """NaN in the model's output, or Inf in its gradient, at the chosen steps"""
    titan = ctx.extra["trainer"].trainer
    nan_steps, inf_steps = _steps("PRIMUS_TEST_NAN_LOSS"), _steps("PRIMUS_TEST_INF_GRAD")

    def fault(_module: Any, _inputs: Any, output: Any) -> Any:
        if titan.step in inf_steps:
            output.register_hook(lambda grad: grad * float("inf"))
        return output * float("nan") if titan.step in nan_steps else output

    for part in titan.model_parts:
        part.register_forward_hook(fault)


@register_patch(
    "test.data_log",
    backend="torchtitan",
    phase="before_train",
    condition=lambda ctx: bool(os.environ.get("PRIMUS_TEST_DATA_LOG")),
)
def data_log(ctx: PatchContext) -> None:
    """the rows each rank reads and a hash of each batch it trains on"""
    import torch.distributed as dist

    assert ctx.run_dir is not None
    rank = dist.get_rank() if dist.is_initialized() else 0
    reads = (ctx.run_dir / f"reads-rank{rank}.txt").open("a", buffering=1)
    batches = (ctx.run_dir / f"batches-rank{rank}.txt").open("a", buffering=1)

    def rows(original: Callable[..., Any]) -> Callable[..., Any]:
        def _get_data_iter(self: Any) -> Any:
            for row in original(self):
                reads.write(f"{self._epoch} {row['id']}\n")
                yield row

        return _get_data_iter

    def batch(original: Callable[..., Any]) -> Callable[..., Any]:
        def post_dataloading_process(self: Any, input_dict: dict, labels: Any) -> Any:
            tokens = input_dict["input"].cpu().numpy().tobytes()
            batches.write(f"{self.step} {hashlib.sha1(tokens).hexdigest()[:16]}\n")
            return original(self, input_dict, labels)

        return post_dataloading_process

    ctx.wrap("torchtitan.hf_datasets.text_datasets.HuggingFaceTextDataset", "_get_data_iter", rows)
    ctx.wrap(type(ctx.extra["trainer"].trainer), "post_dataloading_process", batch)


class SaveOps:
    """Counts the file operations of each checkpoint save; SIGKILLs at the chosen one."""

    def __init__(self, kill_at: str | None, record: str | None) -> None:
        self.save, self.ops = 0, 0
        self.kill = tuple(int(x) for x in kill_at.split(":")) if kill_at else None
        self.record = Path(record) if record else None

    def op(self) -> None:
        self.ops += 1
        if self.kill == (self.save, self.ops):
            os.kill(os.getpid(), signal.SIGKILL)

    def counted(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def operation(*args: Any, **kwargs: Any) -> Any:
            if not (args and args[-1] in ("rb", "r")):  # create_stream for reading: a load
                self.op()
            return original(*args, **kwargs)

        return operation

    def whole_save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def dcp_save(*args: Any, **kwargs: Any) -> Any:
            self.save, self.ops = self.save + 1, 0
            result = original(*args, **kwargs)
            if self.record is not None:
                with self.record.open("a") as f:
                    f.write(f"{self.ops}\n")
            self.op()  # right after the save
            return result

        return dcp_save


@register_patch(
    "test.kill_in_save",
    backend="torchtitan",
    phase="before_train",
    condition=lambda ctx: bool(
        os.environ.get("PRIMUS_TEST_KILL_AT") or os.environ.get("PRIMUS_TEST_SAVE_OPS")
    ),
)
def kill_in_save(ctx: PatchContext) -> None:
    """SIGKILL at a chosen file operation of a checkpoint save"""
    ops = SaveOps(os.environ.get("PRIMUS_TEST_KILL_AT"), os.environ.get("PRIMUS_TEST_SAVE_OPS"))
    checkpointer = type(ctx.extra["trainer"].trainer.checkpointer)
    writer = "torch.distributed.checkpoint.filesystem"
    ctx.wrap(f"{writer}.FileSystem", "create_stream", ops.counted)
    ctx.wrap(f"{writer}.FileSystem", "rename", ops.counted)
    ctx.wrap(writer, "_write_item", ops.counted)
    ctx.wrap(checkpointer, "dcp_save", ops.whole_save)


def _exit_code(main: Callable[[list[str]], None], argv: list[str]) -> int:
    """`main(argv)`'s exit code, its output flushed (a forked child ends with os._exit)."""
    code = 1
    try:
        main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def run_each(kills: list[str], out: str, argv: list[str]) -> None:
    """`primus ARGV` once per kill point (PRIMUS_TEST_KILL_AT), then once without one, each in
    a process forked from this one (torch and TorchTitan imported once, before): run i's
    output goes to OUT/run-i.log, and OUT/runs.json lists how each run ended."""
    import torchtitan.trainer  # noqa: F401  (imported once, before the forks)

    from primus.cli.main import main

    runs = []
    for i, kill in enumerate([*kills, ""]):
        pid = os.fork()
        if pid == 0:
            os.environ["PRIMUS_TEST_KILL_AT"] = kill
            log = os.open(Path(out) / f"run-{i}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os._exit(_exit_code(main, argv))
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status)
        ended = f"signal {os.WTERMSIG(status)}" if killed else f"exit {os.WEXITSTATUS(status)}"
        runs.append({"kill": kill, "ended": ended})
    (Path(out) / "runs.json").write_text(json.dumps(runs, indent=1))
