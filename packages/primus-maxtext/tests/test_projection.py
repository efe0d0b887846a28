"""`primus projection memory` for MaxText: the model's parameters equal MaxText's own count, and
the whole projection is within 10% of the peak memory of each run measured on H100s and H200s
in docs/benchmarks (and of XLA's compiled estimate there)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from primus.backends.maxtext.checkpoint import hf_mapping
from primus.backends.maxtext.projection import layout_overrides, training_job
from primus.core.patches import restore_all
from primus.core.projection import GIB, Job, project
from primus.core.projection.performance import ProjectedRun, project_run, rates_for
from primus.core.runtime.primus_runtime import PrimusRuntime
from primus.testing.faults import Forks
from primus.testing.runs import preset_args

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "configs" / "maxtext" / "llama3.2_1B-pretrain.yaml"
PATCHES = "maxtext.config_errors,maxtext.llama3_rope_factor"


@pytest.fixture(autouse=True)
def _unpatched() -> Iterator[None]:
    yield
    restore_all()


def in_process[T](config: Path, overrides: list[str], use: Callable[[PrimusRuntime], T]) -> T:
    """`use(PrimusRuntime(config, overrides))`, the environment (which a dry run sets for
    MaxText) put back after."""
    saved = dict(os.environ)
    try:
        return use(PrimusRuntime(config, overrides))
    finally:
        os.environ.clear()
        os.environ.update(saved)


def recipe_args(*overrides: str) -> Any:
    """The recipe's MaxText args, as a dry run builds them."""
    return in_process(RECIPE, list(overrides), PrimusRuntime.backend_args)


def maxtext_count(args: Any) -> int:
    """MaxText's parameter count of the model its trainer builds from `args` (abstract)."""
    from maxtext.utils.max_utils import calculate_num_params_from_pytree

    _, params, _ = hf_mapping.abstract_model(hf_mapping.maxtext_config(args.argv))
    return int(calculate_num_params_from_pytree(params))


def test_the_recipes_parameters_equal_maxtexts_count() -> None:
    args = recipe_args()
    assert training_job(args, 1, frozenset()).model.parameters() == maxtext_count(args)


def test_an_moe_presets_parameters_equal_maxtexts_count(tmp_path: Path) -> None:
    args = preset_args(tmp_path, "maxtext", "maxtext_pretrain", "mixtral_8x7B", PATCHES,
                       hardware="cpu")  # fmt: skip
    job = training_job(args, 1, frozenset())
    assert job.model.experts == 8 and job.model.parameters() == maxtext_count(args)


def test_bytes_and_recompute_follow_maxtexts_keys() -> None:
    def state(job: Job) -> tuple[Any, ...]:
        return (job.weight_bytes, job.grad_bytes, job.optimizer_bytes, job.logit_bytes,
                job.recompute, job.global_batch)  # fmt: skip

    # float32 weights, gradients and adamw moments; bf16 logits and their gradient
    recipe = training_job(recipe_args("remat_policy=full", "per_device_batch_size=2"), 1,
                          frozenset())  # fmt: skip
    assert state(recipe) == (4, 4, 8, 4, "full", 2)
    changed = recipe_args("weight_dtype=bfloat16", "remat_policy=minimal", "dtype=float32",
                          "gradient_accumulation_steps=2", "per_device_batch_size=2")  # fmt: skip
    # bf16 weights, gradients (and their accumulator) and moments (mu_dtype follows the
    # weights'), fp32 logits; `minimal` keeps the projections' outputs
    assert state(training_job(changed, 1, frozenset())) == (2, 4, 4, 8, "projections", 4)


def test_layout_overrides_give_the_same_job_back() -> None:
    args = recipe_args("ici_tensor_parallelism=2", "per_device_batch_size=1",
                       "gradient_accumulation_steps=2")  # fmt: skip
    job = training_job(args, 4, frozenset())
    assert (job.tp, job.dp, job.zero, job.micro_batch, job.global_batch) == (2, 2, 3, 2, 8)
    overrides = [f"{key}={json.dumps(value)}" for key, value in layout_overrides(job).items()]
    assert training_job(recipe_args(*overrides), 4, frozenset()) == job
    # a pipeline: MaxText's micro batches split each device's batch
    piped = layout_overrides(replace(job, tp=1, pp=2))
    assert piped["per_device_batch_size"] == 2 * 2 / 2 and piped["num_pipeline_microbatches"] == 2


# Runs of the current code with the device's peak memory (Primus's step line): (JSON, key or
# None for the page's "primus" run, the recipe's keys before 2026-11-26 or none). Not
# projected: MaxText's own runs (no peak recorded) and the XLA-flag experiment of
# eight-gpus.md (flags that hold more for overlap).
BEFORE = ("remat_policy=full", "per_device_batch_size=2")  # the 1B recipe until 2026-11-26
MEASURED_RUNS = [
    ("maxtext-h100-2026-11-21.json", None, BEFORE),
    *(("maxtext-cudnn-attention-2026-11-26.json", key, BEFORE) for key in (
        "h100_recipe_cudnn (call 3)", "h100_cudnn_minimal_b2 (call 3)",
        "h100_cudnn_minimal_b4 (call 2)", "h100_cudnn_minimal_b8 (call 3)",
        "2xh100_recipe_patched_2gpus (call 4)")),
    ("maxtext-cudnn-attention-2026-11-26.json", "h100_8B_recipe_4_layers_cudnn (call 8)", ()),
    *(("eight-gpus-h200x4-2026-11-26.json", key, ()) for key in (
        "maxtext-16l-1gpu", "maxtext-16l-4gpu-dp", "maxtext-16l-4gpu-sharded",
        "maxtext-8b-4gpu-sharded")),
    ("maxtext-recipe-minimal-2026-11-26.json", "2xh100_recipe_2gpus (call e)", ()),
]  # fmt: skip


# The runs that predate maxtext.cudnn_attention: `autoselected` ran tokamax's attention there
TOKAMAX = {"maxtext-h100-2026-11-21.json", "eight-gpus-h200x4-2026-11-26.json"}
# Their pace: all but the pure data-parallel run, made without maxtext.gpu_attention_sharding
# (each GPU computed every sequence's attention: eight-gpus.md), which the projection does not model
PACED = [i for i, (_, key, _) in enumerate(MEASURED_RUNS) if key != "maxtext-16l-4gpu-dp"]
IDS = [f"{page.split('-2026')[0]}-{key or 'primus'}" for page, key, _ in MEASURED_RUNS]


def measured(case: int) -> dict[str, Any]:
    page, key, _ = MEASURED_RUNS[case]
    data = json.loads((ROOT / "docs" / "benchmarks" / page).read_text())
    return data[key] if key else data


@pytest.fixture(scope="module")
def projections() -> list[ProjectedRun]:
    """What `primus projection performance` projects (in process) for each run as it was made,
    on its device."""

    def project_case(case: int) -> ProjectedRun:
        page, key, before = MEASURED_RUNS[case]
        run = measured(case)
        if key is None:  # the 1B recipe on one GPU
            config, gpus, overrides = ROOT / run["config"], 1, []
        else:  # the bench's command, from tools/bench
            config = (ROOT / "tools" / "bench" / run["config"]).resolve()
            gpus, overrides = run["gpus"], run.get("overrides", [])
        tokamax = ["attention=flash"] if page in TOKAMAX else []
        rates = rates_for(run["device"], [])
        return in_process(config, [*before, *overrides, *tokamax],
                          lambda runtime: project_run(runtime, gpus, rates))  # fmt: skip

    return [project_case(case) for case in range(len(MEASURED_RUNS))]


@pytest.mark.parametrize("case", range(len(MEASURED_RUNS)), ids=IDS)
def test_the_projection_is_within_10_percent_of_the_measured_peak(
    projections: list[ProjectedRun], case: int
) -> None:
    total = project(projections[case].job).total / GIB
    run = measured(case)
    # the device's peak_bytes_in_use (Primus's step line) and XLA's compiled estimate (MaxText's
    # "Total estimated memory size", in GiB)
    for peak in (run["primus"]["peak_memory_gib"], run["primus"]["estimated_memory_gb"]):
        assert total == pytest.approx(peak, rel=0.10), f"{total:.2f} vs {peak:.2f} GiB"


@pytest.mark.parametrize("case", PACED, ids=[IDS[i] for i in PACED])
def test_the_projected_throughput_is_within_15_percent_of_the_measured_one(
    projections: list[ProjectedRun], case: int
) -> None:
    tokens = projections[case].step.tokens_per_s_per_gpu
    paced = measured(case)["primus"]["tokens_per_s_per_gpu"]
    assert tokens == pytest.approx(paced, rel=0.15), f"{tokens:,.0f} vs {paced:,.0f}"


def test_gpus_the_layout_does_not_divide_exit_2_with_the_fix(forks: Forks) -> None:
    """`primus projection memory`, forked by conftest's `forks`."""
    result = forks.run(["projection", "memory", "--config", str(RECIPE), "--gpus", "3",
                        "ici_tensor_parallelism=2"], {})  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "--gpus 3 is not a multiple of tp 2 x pp 1 x cp 1 = 2" in result.stderr
    assert "hint: pass --gpus 2" in result.stderr and "Traceback" not in result.stderr


def test_a_tiny_model_is_counted_in_thousands_of_parameters_on_one_gpu(forks: Forks) -> None:
    """The tiny recipe's 125,248 parameters, not "0.000 B"; and "1 GPU", not "1 GPUs"."""
    tiny = RECIPE.with_name("tiny-cpu.yaml")
    result = forks.run(["projection", "memory", "--config", str(tiny), "--gpus", "1"], {})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "model: 125.248 K parameters, 125.248 K on the most loaded GPU\n" in result.stdout
    assert "layout: 1 GPU = tp 1 x pp 1 x cp 1 x dp 1; ZeRO stage 0" in result.stdout
