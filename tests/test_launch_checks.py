"""A launch is checked before anything starts: the nodes' addresses, the processes against
the model replica's parallel sizes, the global batch against the data-parallel ranks. Each case
is a real `primus` process that must exit 2 with the key at fault, without importing a
framework; a launch, its dry run and `config validate --nproc-per-node` agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.testing.runs import FAST_FORMS as FORMS
from primus.testing.runs import primus_imports, refused

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MEGATRON, TORCHTITAN, MAXTEXT = (
    CONFIGS / b / "tiny-cpu.yaml" for b in ("megatron", "torchtitan", "maxtext")
)


@pytest.mark.parametrize("form", ["run", "dry-run"])
def test_several_nodes_without_the_address_of_node_0_are_refused(tmp_path: Path, form: str) -> None:
    said = refused(tmp_path, form, MEGATRON, "--nnodes", "2")
    assert "several nodes need the address of node 0" in said


def test_a_port_out_of_range_is_refused(tmp_path: Path) -> None:
    said = refused(tmp_path, "dry-run", MEGATRON, "--nproc-per-node", "2", "--master-port", "99999")
    assert "Invalid value for '--master-port'" in said and "65535" in said


@pytest.mark.parametrize(
    ("config", "args", "message"),
    [
        (MEGATRON, ["--nproc-per-node", "3", "tensor_model_parallel_size=2"],
         "3 processes (--nnodes 1 x --nproc-per-node 3) cannot hold model replicas of 2 "
         "processes (tensor_model_parallel_size 2 x pipeline_model_parallel_size 1 x "
         "context_parallel_size 1)"),
        (MEGATRON, ["tensor_model_parallel_size=2"],
         "1 process (no --nproc-per-node) cannot hold model replicas of 2"),
        (TORCHTITAN, ["--nproc-per-node", "3", "parallelism.tensor_parallel_degree=2"],
         "3 processes (--nnodes 1 x --nproc-per-node 3) cannot hold model replicas of 2 "
         "processes (parallelism.tensor_parallel_degree 2)"),
    ],
    ids=["megatron-launch", "megatron-one-process", "torchtitan-launch"],
)  # fmt: skip
def test_processes_that_cannot_hold_the_parallel_layout_are_refused(
    cached_schemas: None, tmp_path: Path, config: Path, args: list[str], message: str
) -> None:
    """A launch (and its dry run, and `slurm`) whose process count the model replica's
    parallel sizes do not divide; a single-process run of a multi-process layout."""
    forms = ["run", "dry-run"] if "--nproc-per-node" in args else ["run"]
    for form in forms:
        said = refused(tmp_path, form, config, *args)
        assert message in said and "hint: start a multiple of 2 processes" in said, said
    if config == MEGATRON and forms == ["run", "dry-run"]:
        done, imported = primus_imports(
            "slurm", "pretrain", "--dry-run", "--config", str(config), *args,
            PRIMUS_WORKSPACE=str(tmp_path / "ws"),
        )  # fmt: skip
        assert (
            done.returncode == 2 and imported == [] and "cannot hold model replicas" in done.stderr
        )


@pytest.mark.parametrize(
    ("config", "forms", "args", "message"),
    [
        (MEGATRON, list(FORMS), ["global_batch_size=4"],
         "global_batch_size 4 cannot be split into micro-batches of 4 (micro_batch_size) over 2 "
         "data-parallel ranks\n  hint: set global_batch_size to a multiple of 8"),
        (TORCHTITAN, ["validate"], ["training.global_batch_size=12"],
         "training.global_batch_size 12 cannot be split into local batches of 4 "
         "(training.local_batch_size) over 2 data-parallel ranks"),
        (TORCHTITAN, ["validate"], ["parallelism.data_parallel_shard_degree=1"],
         "the parallel degrees span 1 process (data_parallel_replicate_degree 1 x "
         "data_parallel_shard_degree 1 x"),
        (MAXTEXT, ["run", "validate"], ["per_device_batch_size=0.25"],
         "per_device_batch_size 0.25 on 2 devices trains on no row a step (MaxText rounds 0.25 "
         "x 2 down to 0)\n  hint: set per_device_batch_size to at least 0.5"),
    ],
    ids=["megatron-batch", "torchtitan-batch", "torchtitan-degrees", "maxtext-no-row"],
)  # fmt: skip
def test_a_launch_its_batch_or_degrees_do_not_fit_is_refused(
    cached_schemas: None, tmp_path: Path, config: Path, forms: list[str], args: list[str],
    message: str,
) -> None:  # fmt: skip
    """Two processes whose data-parallel ranks the global batch does not split over (or whose
    degrees span another count): the upstream asserts it once every rank has imported it.
    MaxText's rows of a step round down to none: it would train on nothing, silently."""
    for form in forms:
        said = refused(tmp_path, form, config, "--nproc-per-node", "2", *args)
        assert message in said, said
