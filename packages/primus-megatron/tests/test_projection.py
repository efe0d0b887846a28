"""`primus projection memory` for Megatron: the weight and optimizer bytes equal Megatron's own
theoretical-memory count (megatron.training.theoretical_memory_usage), and the whole projection
is within 10% of the peak memory measured on H100s in docs/benchmarks."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from primus.backends.megatron.projection import training_job
from primus.core.patches import restore_all
from primus.core.posttrain import PeftConfig
from primus.core.projection import GIB, Job, project
from primus.core.projection.performance import device_rates, project_step
from primus.core.runtime import PrimusRuntime
from primus.testing.runs import preset_args, primus

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "configs" / "megatron" / "llama3.2_1B-pretrain.yaml"
BENCHMARKS = ROOT / "docs" / "benchmarks"
GPU_BUILD = "megatron.build_without_gpu,megatron.cuda_device_max_connections"


def megatron_count(args: Any, gpus: int) -> float:
    """Megatron's weight + optimizer bytes on the most loaded GPU for these args."""
    from megatron.training.theoretical_memory_usage import compute_weight_and_optimizer_memory

    job = training_job(args, gpus, frozenset())
    reference = copy.copy(args)
    reference.padded_vocab_size = job.model.vocab
    reference.world_size, reference.data_parallel_size = gpus, job.dp
    reference.expert_tensor_parallel_size = args.tensor_model_parallel_size
    return compute_weight_and_optimizer_memory(reference)


@pytest.mark.parametrize(
    ("gpus", "overrides"),
    [
        (1, {}),
        (2, {"tensor_model_parallel_size": 2}),
        (2, {"pipeline_model_parallel_size": 2}),
        (4, {"use_distributed_optimizer": True}),
        (4, {"untie_embeddings_and_output_weights": True, "tensor_model_parallel_size": 2}),
    ],
    ids=["one-gpu", "tp2", "pp2", "distributed-optimizer-dp4", "untied-tp2-dp2"],
)
def test_weights_and_optimizer_state_equal_megatrons_count(
    tmp_path: Path, gpus: int, overrides: dict[str, Any]
) -> None:
    try:  # a GPU job's args, built here without one (what the projection does)
        args = preset_args(tmp_path, "megatron", "megatron_pretrain", "llama3.2_1B", GPU_BUILD,
                           device="cuda", **overrides)  # fmt: skip
    finally:
        restore_all()
    p = project(training_job(args, gpus, frozenset()))
    ours = p.weights + p.gradients + p.optimizer
    # Megatron counts the first stage; with pp 2 the last one (its own copy of the tied
    # embedding, and the final norm) is the most loaded by one norm's bytes
    assert ours == pytest.approx(megatron_count(args, gpus), rel=1e-5)


class Linear(torch.nn.Identity):
    """A Megatron parallel linear as add_lora sees one: its tensor-parallel group (None: one
    rank) and its sharded state dict (none of its own)."""

    tp_group = None

    def sharded_state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


class Decoder(torch.nn.Module):
    """The linears add_lora adapts, nested as in Megatron's GPTModel (identities: no weights).

    A stand-in for the real model, said so here: a GPTModel needs Megatron's parallel state and
    would allocate the 1B model's weights, while add_lora (Primus's) only walks these names and
    wraps each linear; the adapters it adds are real."""

    def __init__(self, layers: int) -> None:
        super().__init__()

        def block(*names: str) -> torch.nn.ModuleDict:
            return torch.nn.ModuleDict({name: Linear() for name in names})

        def layer(number: int) -> torch.nn.ModuleDict:
            found = torch.nn.ModuleDict({"self_attention": block("linear_qkv", "linear_proj"),
                                         "mlp": block("linear_fc1", "linear_fc2")})  # fmt: skip
            found.layer_number = number  # type: ignore[assignment]
            return found

        self.decoder = torch.nn.Module()
        self.decoder.layers = torch.nn.ModuleList(layer(n) for n in range(1, layers + 1))

    def sharded_state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


def test_with_lora_only_the_adapters_have_gradients_and_optimizer_state(tmp_path: Path) -> None:
    """The 1B recipe with `peft:` (rank 16, every projection but gate_proj): the projected
    adapters are the parameters add_lora adds to the model's linears (one pair per HF
    projection); the bf16 weights include them, the fp32 gradients and the master copy and
    Adam's moments are theirs alone."""
    from primus.backends.megatron.posttrain.lora import add_lora

    try:
        args = preset_args(tmp_path, "megatron", "megatron_pretrain", "llama3.2_1B", GPU_BUILD,
                           device="cuda")  # fmt: skip
    finally:
        restore_all()
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj")
    args.primus_peft = PeftConfig("lora", 16, 32.0, 0.0, targets, {})
    model = Decoder(args.num_layers)
    with torch.device("meta"):
        add_lora(model, args)
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    p = project(training_job(args, 1, frozenset()))
    assert adapters > 0 and p.parameters_per_gpu == p.parameters + adapters
    assert (p.weights, p.gradients, p.optimizer) == (
        2 * (p.parameters + adapters), 4 * adapters, 12 * adapters,
    )  # fmt: skip


# (benchmark JSON, its variant, overrides of the 1B recipe, GPUs): the runs measured on H100s
# and an H200, with their step time and peak memory (torch's max_memory_allocated)
NO_GRAPHS = ["turbo.enable=true", "turbo.cuda_graphs=false"]  # measured before turbo had them
MEASURED = [
    ("megatron-h100-2026-11-21.json", "primus", ["turbo.enable=false"], 1),
    ("megatron-h200-2026-11-21.json", "primus", ["turbo.enable=false"], 1),
    ("e2e-megatron-h100-2026-11-21.json", "primus-turbo", NO_GRAPHS, 1),
    ("megatron-cuda-graphs-h100-2026-11-25.json", "turbo", NO_GRAPHS, 1),
    ("megatron-cuda-graphs-h100-2026-11-25.json", "graphs", ["turbo.enable=true"], 1),
    ("megatron-micro-batches-h100-2026-11-27.json", "mb1", ["turbo.enable=true"], 1),
    ("megatron-micro-batches-h100-2026-11-27.json", "mb2",
     ["turbo.enable=true", "micro_batch_size=2"], 1),
    ("megatron-sequence-parallel-h100x2-2026-11-25.json", "tp2",
     [*NO_GRAPHS, "tensor_model_parallel_size=2"], 2),
    ("megatron-sequence-parallel-h100x2-2026-11-25.json", "tp2sp",
     [*NO_GRAPHS, "tensor_model_parallel_size=2", "sequence_parallel=true"], 2),
]  # fmt: skip
IDS = [f"{name.split('-2026')[0]}-{variant}" for name, variant, _, _ in MEASURED]


def measured(case: int) -> dict[str, Any]:
    name, variant, _, _ = MEASURED[case]
    record = json.loads((BENCHMARKS / name).read_text())
    return record[variant] | {"device": record["device"]}


def training_job_of(overrides: list[str], gpus: int) -> Job:
    """The job `primus projection` sees for the recipe with `overrides`, built in this process
    (the CLI's path is `test_the_ranking_...`'s); the environment and the patched names are put
    back afterwards."""
    saved = dict(os.environ)
    try:
        return PrimusRuntime(RECIPE, overrides).training_job(gpus)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        restore_all()


@pytest.fixture(scope="module")
def projected() -> list[dict[str, Any]]:
    """The projected memory and step of each measured run, on the run's device."""
    runs = []
    for i, (_, _, overrides, gpus) in enumerate(MEASURED):
        job = training_job_of(overrides, gpus)
        step = project_step(job, device_rates(measured(i)["device"]))
        runs.append({"memory_bytes": project(job).as_dict(), "step_ms": step.as_dict()})
    return runs


@pytest.mark.parametrize("case", range(len(MEASURED)), ids=IDS)
def test_the_projection_is_within_10_percent_of_the_measured_peak(
    projected: list[dict[str, Any]], case: int
) -> None:
    """What tensors hold: the total less a CUDA graph's pool, which only the reserved peak
    includes (`test_with_cuda_graphs_the_reserved_peak_...`)."""
    memory = projected[case]["memory_bytes"]
    held = (memory["total"] - memory["graph_pool"]) / GIB
    peak = measured(case)["peak_memory_gib"]
    assert held == pytest.approx(peak, rel=0.10), f"{held:.2f} GiB vs {peak:.2f} GiB"


# (benchmark JSON, its variant, overrides of the 1B recipe): one H200's reserved peaks
# (torch's max_memory_reserved) with the full-iteration CUDA graph and without
RESERVED = [
    ("megatron-graph-memory-h200-2026-11-29.json", "graphs", ["turbo.enable=true"]),
    ("megatron-graph-memory-h200-2026-11-29.json", "eager", NO_GRAPHS),
    ("megatron-graph-memory-scan-h200-2026-11-29.json", "graphs-gbs4",
     ["turbo.enable=true", "global_batch_size=4"]),
    ("megatron-graph-memory-scan-h200-2026-11-29.json", "graphs-gbs16",
     ["turbo.enable=true", "global_batch_size=16"]),
    ("megatron-graph-memory-scan-h200-2026-11-29.json", "graphs-mb2",
     ["turbo.enable=true", "micro_batch_size=2"]),
]  # fmt: skip


@pytest.mark.parametrize("case", RESERVED, ids=[variant for _, variant, _ in RESERVED])
def test_with_cuda_graphs_the_reserved_peak_lies_within_the_counted_pool(
    case: tuple[str, str, list[str]],
) -> None:
    """The graph's pool is counted as one more copy of the activations and logits, an upper
    bound: the reserved peak lies between the total without it and the total (without the
    graph, the reserved peak is the allocated one, within 10%)."""
    name, variant, overrides = case
    reserved = json.loads((BENCHMARKS / name).read_text())[variant]["reserved_memory_gib"]
    memory = project(training_job_of(overrides, 1)).as_dict()
    total, pool = memory["total"] / GIB, memory["graph_pool"] / GIB
    assert (pool > 0) == variant.startswith("graphs")
    if pool:
        assert total - pool < reserved <= total, (
            f"{total - pool:.2f} < {reserved:.2f} <= {total:.2f}"
        )
    else:
        assert total == pytest.approx(reserved, rel=0.10), f"{total:.2f} vs {reserved:.2f} GiB"


@pytest.mark.parametrize("case", range(len(MEASURED)), ids=IDS)
def test_the_projected_step_is_within_15_percent_of_the_measured_one(
    projected: list[dict[str, Any]], case: int
) -> None:
    step = projected[case]["step_ms"]["step"]
    ms = measured(case)["ms_per_iter"]
    assert step == pytest.approx(ms, rel=0.15), f"{step:.1f} ms vs {ms:.1f} ms"


def test_the_ranking_lists_layouts_that_fit_fastest_first_as_overrides(tmp_path: Path) -> None:
    out = tmp_path / "ranked.json"
    result = primus("projection", "performance", "--config", str(RECIPE), "--gpus", "8",
                    "--top", "50", "--json", str(out), "turbo.enable=true")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    memory = json.loads(out.read_text())["memory_bytes"]["total"] / 2**30
    headline = f"memory: {memory:.1f} GiB on the most loaded GPU (primus projection memory)"
    assert f"{headline}, of H100's 80 GiB\n" in result.stdout
    ranked = json.loads(out.read_text())["ranked"]
    steps = [r["step_ms"]["step"] for r in ranked]
    assert len(ranked) > 10 and steps == sorted(steps)
    assert all(r["memory_gib"] <= 80 * 0.85 for r in ranked)
    # 32 heads and 8 KV groups: tensor parallelism up to 8, data parallelism fills the rest
    assert {r["overrides"].get("tensor_model_parallel_size", 1) for r in ranked} <= {1, 2, 4, 8}
    first = " ".join(f"{k}={json.dumps(v)}" for k, v in ranked[0]["overrides"].items())
    assert first in result.stdout
    # each row's overrides, pasted, give that row's layout
    again = tmp_path / "again.json"
    pasted = [f"{k}={json.dumps(v)}" for k, v in ranked[0]["overrides"].items()]
    result = primus("projection", "performance", "--config", str(RECIPE), "--gpus", "8",
                    "--top", "0", "--json", str(again), "turbo.enable=true", "peak_tflops=900",
                    *pasted)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # (Megatron pads the vocabulary for the TP size; the ranking keeps the configured padding)
    record = json.loads(again.read_text())
    assert record["step_ms"]["step"] == pytest.approx(ranked[0]["step_ms"]["step"], rel=1e-3)
    # MFU against the peak the run's step line would use, and named as it names it
    assert record["peak"]["source"] == "config" and record["peak"]["tflops"] == 900
    step = record["step_ms"]
    assert step["mfu"] == pytest.approx(step["model_tflops_per_gpu"] / 900)
    assert "MFU peak: 900 TFLOP/s (peak_tflops)" in result.stdout


def test_gpus_the_layout_does_not_divide_exit_2_with_the_fix() -> None:
    result = primus("projection", "memory", "--config", str(RECIPE), "--gpus", "3",
                    "tensor_model_parallel_size=2")  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    said = " ".join(result.stderr.split())  # refused before Megatron's args are built, as a run
    assert "3 processes (--gpus 3) cannot hold model replicas of 2 processes" in said
    assert "hint: start a multiple of 2 processes" in said and "Traceback" not in said
    result = primus("projection", "memory", "--config", str(RECIPE), "--gpus", "3")
    assert result.returncode == 2, result.stderr[-3000:]  # the global batch, as a run says
    split = "global_batch_size 8 cannot be split into micro-batches of 1 (micro_batch_size) over 3"
    assert split in result.stderr and "Traceback" not in result.stderr


def test_the_gemm_benchmark_times_the_jobs_gemms_on_the_real_device(tmp_path: Path) -> None:
    """The job's build patches torch.cuda with CPU shims here; the benchmark undoes them, so
    it times real matmuls (the shims' events would time nothing)."""
    out = tmp_path / "gemms.json"
    result = primus("benchmark", "gemm", "--config", str(ROOT / "configs/megatron/tiny-cpu.yaml"),
                    "--dtype", "fp32", "--repeats", "3", "--json", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    gemms = json.loads(out.read_text())["ops"]
    assert [g["op"]["name"] for g in gemms] == [
        "qkv",
        "attention_out",
        "mlp_up",
        "mlp_down",
        "logits",
    ]
    assert all(g["median_ms"] > 0 and g["tflops"] > 0 for g in gemms)


def test_the_collectives_benchmark_times_the_jobs_messages(tmp_path: Path) -> None:
    out = tmp_path / "collectives.json"
    """Over two ranks: the experiment's build sets a rank's environment variables, which once
    made the command run as a worker of one rank instead of launching two."""
    result = primus("benchmark", "collectives", "--config",
                    str(ROOT / "configs/megatron/tiny-cpu.yaml"), "--repeats", "1", "--json",
                    str(out), "--nproc-per-node", "2")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(out.read_text())["ranks"] == 2
    rows = json.loads(out.read_text())["rows"]
    assert sorted({r["message"] for r in rows}) == ["dp_gradients", "tp_activations"]
    assert all(r["bytes"] > 0 and r["median_ms"] > 0 for r in rows)
