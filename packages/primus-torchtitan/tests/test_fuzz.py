"""Bad input on TorchTitan: over 300 bad experiments and override lists, mutated from the tiny CPU
recipe, each one config error (exit 2, file:line, no traceback) on which `config validate`
and `train --dry-run` agree; TorchTitan's model-build-time refusals are found at validation."""

from __future__ import annotations

from pathlib import Path

from primus.backends.torchtitan.config.bridge import RULES
from primus.backends.torchtitan.torchtitan_adapter import TorchTitanAdapter
from primus.testing.fuzz_runs import check_backend, refusal_problems, run_in_process

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "torchtitan" / "tiny-cpu.yaml"
SIZES = [
    "training.local_batch_size", "training.seq_len", "training.steps", "model.dim",
    "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.ffn_hidden_dim",
    "model.vocab_size", "model.max_seq_len",
]  # fmt: skip
# Refused by TorchTitan only when it builds the model (attention.py, decoder.py) or sets up the
# trainer: here at validation
MODEL_BUILD = {
    "kv heads do not divide heads": ("model.n_kv_heads", [("model.n_kv_heads", 3)]),
    "heads not a multiple of kv heads": ("model.n_kv_heads", [("model.n_heads", 5)]),
    "tensor parallel does not divide heads": (
        "parallelism.tensor_parallel_degree",
        [("parallelism.tensor_parallel_degree", 3)],
    ),
    "sequence longer than the RoPE table": ("training.seq_len", [("training.seq_len", 1024)]),
    # refused by the trainer's set-up
    "global batch not a multiple of the local batch": (
        "training.global_batch_size",
        [("training.global_batch_size", 6)],
    ),
}


# Refused by TorchTitan only once every rank has started (ParallelDims), or trained on (a
# negative warm-up, a decay past the schedule, gradients clipped to nothing): here at validation
LATER = {
    "data-parallel shard degree 0": (
        "parallelism.data_parallel_shard_degree",
        [("parallelism.data_parallel_shard_degree", 0)],
    ),
    "data-parallel shard degree below -1": (
        "parallelism.data_parallel_shard_degree",
        [("parallelism.data_parallel_shard_degree", -3)],
    ),
    "negative warm-up": ("lr_scheduler.warmup_steps", [("lr_scheduler.warmup_steps", -5)]),
    "decay ratio above 1": ("lr_scheduler.decay_ratio", [("lr_scheduler.decay_ratio", 1.5)]),
    "gradients clipped to 0": ("training.max_norm", [("training.max_norm", 0.0)]),
    # the validator reads c4 from the Hub at step 1, not the mock data
    "validation beside mock data": ("validator.enable", [("validator.enable", True)]),
    "validation on a prepared corpus": (
        "validator.dataloader.dataset",
        [("validator.enable", True), ("validator.dataloader.dataset", "indexed")],
    ),
    # the CPU recipe: a GPU-only copy at the first save, a CUDA memory profiler at step 1
    "pinned-memory checkpoints on a CPU": (
        "checkpoint.async_mode",
        [("checkpoint.async_mode", "async_with_pinned_mem")],
    ),
    # the model's dimensions are read when the trainer builds it
    "a model dimension set to null": ("model.dim", [("model.dim", None)]),
    "memory snapshots on a CPU": (
        "profiler.enable_memory_snapshot",
        [("profiler.enable_memory_snapshot", True)],
    ),
}
# TorchTitan's own sentinels and bounds, which validation must take as TorchTitan does
LEGAL = [
    "training.global_batch_size=-1", "parallelism.data_parallel_shard_degree=-1",
    "lr_scheduler.warmup_steps=0", "lr_scheduler.decay_ratio=1.0", "lr_scheduler.min_lr_factor=1.0",
    "lr_scheduler.total_steps=null",
]  # fmt: skip


def test_every_bad_input_is_one_config_error(tmp_path, record_property) -> None:
    report = check_backend(RECIPE, SIZES, MODEL_BUILD | LATER, tmp_path, RULES)
    record_property("fuzz", str(report).splitlines()[0])
    print(f"\ntorchtitan fuzz: {report}")
    assert not report.failures, str(report)
    schema = TorchTitanAdapter("torchtitan").param_schema()
    assert set(RULES) <= set(schema.specs)  # each rule names a real key


def test_model_build_refusals_are_found_at_validation_with_the_key_and_fix(tmp_path) -> None:
    assert refusal_problems(RECIPE, MODEL_BUILD | LATER, tmp_path) == []


def test_torchtitans_sentinels_and_bounds_validate(tmp_path) -> None:
    for full in ([], ["--full"]):
        done = run_in_process(["config", "validate", *full, str(RECIPE), *LEGAL], tmp_path, {})
        assert done.code == 0, done.stderr[-3000:]
