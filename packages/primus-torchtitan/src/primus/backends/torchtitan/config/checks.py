"""TorchTitan's checks of a launch, without TorchTitan: what its ParallelDims and trainer
assert once every rank has imported it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from primus.backends.torchtitan.data.inputs import INDEXED
from primus.core.config import ModuleConfig

DEGREES = ("data_parallel_replicate_degree", "data_parallel_shard_degree",
           "context_parallel_degree", "tensor_parallel_degree", "pipeline_parallel_degree")  # fmt: skip


def check_launch(config: ModuleConfig, value: Callable[[str], Any], processes: int) -> None:
    """The parallel degrees multiply to `processes` (a shard degree of -1 takes the rest), and
    the global batch splits into local batches over the data-parallel ranks (`value`: a
    dotted key's value, TorchTitan's default when unset)."""
    replicate, shard, *model = (value(f"parallelism.{name}") for name in DEGREES)
    if shard == -1:
        shard = processes // (replicate * model[0] * model[1] * model[2])
    elif (spanned := replicate * shard * model[0] * model[1] * model[2]) != processes:
        product = " x ".join(f"{n} {value(f'parallelism.{n}')}" for n in DEGREES)
        raise config.error(
            "parallelism.data_parallel_shard_degree",
            f"the parallel degrees span {spanned} process{'es' * (spanned != 1)} ({product}), "
            f"the launch starts {processes}",
            hint="the degrees must multiply to the processes; data_parallel_shard_degree: -1 "
            "takes the rest",
        )
    check_batch(config, value, replicate * shard)


def check_batch(config: ModuleConfig, value: Callable[[str], Any], data: int = 1) -> None:
    """The global batch splits into local batches over `data` data-parallel ranks; with the
    default of 1, what holds for any number of processes."""
    local, total = value("training.local_batch_size"), value("training.global_batch_size")
    if total > 0 and total % (local * data):
        ranks = f" over {data} data-parallel ranks" if data > 1 else ""
        raise config.error(
            "training.global_batch_size",
            f"training.global_batch_size {total} cannot be split into local batches of {local} "
            f"(training.local_batch_size){ranks}",
            hint=f"set training.global_batch_size to a multiple of {local * data}, or to -1 "
            "(one local batch per rank)",
        )


def check_sequence(config: ModuleConfig, value: Callable[[str], Any]) -> None:
    """The training sequence fits the model's RoPE table (TorchTitan refuses it only when it
    builds the model)."""
    seq_len, table = value("training.seq_len"), value("model.max_seq_len")
    if isinstance(seq_len, int) and isinstance(table, int) and seq_len > table:
        key = "training.seq_len" if config.origin("training.seq_len") else "model.max_seq_len"
        raise config.error(
            key,
            f"training.seq_len {seq_len} exceeds the model's RoPE table (model.max_seq_len "
            f"{table})",
            hint=f"set training.seq_len to at most {table}, or model.max_seq_len to at least "
            f"{seq_len}",
        )


def check_validator(config: ModuleConfig, value: Callable[[str], Any]) -> None:
    """TorchTitan's validator reads its own dataloader (`validator.dataloader.*`; by default
    c4_validation from the Hugging Face Hub), never the training data, and cannot read a
    prepared corpus: beside mock data or a corpus it failed at step 1 without the network."""
    if value("validator.enable") is not True:
        return
    dataset = value("validator.dataloader.dataset")
    if dataset == INDEXED:
        raise config.error(
            "validator.dataloader.dataset",
            "validator.dataloader.dataset: TorchTitan's validator cannot read a prepared "
            "corpus (it reads c4-style text datasets)",
            hint="set validator.dataloader.dataset to a text dataset it reads, or "
            "validator.enable: false",
        )
    training = "mock data" if config.params.get("mock_data") is True else None
    training = "a prepared corpus" if value("dataloader.dataset") == INDEXED else training
    named = config.origin("validator.dataloader.dataset") or value(
        "validator.dataloader.dataset_path"
    )
    if training and not named:
        raise config.error(
            "validator.enable",
            f"validator.enable: TorchTitan's validator reads its own dataset, by default "
            f"{dataset} from the Hugging Face Hub, not the {training} this run trains on",
            hint="name the validation data (validator.dataloader.dataset, .dataset_path), or "
            "set validator.enable: false",
        )


# what TorchTitan runs on a GPU only: key -> (the value that needs one, what fails on a CPU,
# the CPU's value)
GPU_ONLY = {
    "checkpoint.async_mode": (
        "async_with_pinned_mem",
        "the first save's pinned-memory copy",
        "async",
    ),
    "profiler.enable_memory_snapshot": (True, "the memory profiler, at step 1", "false"),
}


def check_cpu_features(config: ModuleConfig, value: Callable[[str], Any]) -> None:
    """Settings TorchTitan takes and then fails on in a run on the CPU (device: cpu; with auto,
    the host that checks may not be the one that trains), minutes in."""
    asked = [key for key, (needs, *_) in GPU_ONLY.items() if value(key) == needs]
    if not asked or value("device") != "cpu":
        return
    key, (needs, what, instead) = asked[0], GPU_ONLY[asked[0]]
    shown = str(needs).lower() if isinstance(needs, bool) else needs
    raise config.error(
        key,
        f"{key}: {shown} needs a GPU, and this run is on the CPU ({what} would fail)",
        hint=f"set {key}: {instead} for a CPU run",
    )
