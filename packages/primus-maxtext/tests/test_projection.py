"""`primus projection memory` for MaxText: the model's parameters equal MaxText's own count, and
the whole projection is within 10% of the peak memory measured on an H100 in docs/benchmarks
(and of XLA's compiled estimate there)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from primus.backends.maxtext import hf_convert
from primus.backends.maxtext.projection import layout_overrides, training_job
from primus.core.patches import restore_all
from primus.core.projection import GIB, Job
from primus.core.runtime.primus_runtime import PrimusRuntime
from primus.core.testing.runs import preset_args, primus

ROOT = Path(__file__).parents[3]
RECIPE = ROOT / "configs" / "maxtext" / "llama3.2_1B-pretrain.yaml"
MEASURED = ROOT / "docs" / "benchmarks" / "maxtext-h100-2026-11-21.json"  # the recipe, 1 GPU
PATCHES = "maxtext.config_errors,maxtext.llama3_rope_factor"


@pytest.fixture(autouse=True)
def _unpatched() -> Iterator[None]:
    yield
    restore_all()


def recipe_args(*overrides: str) -> Any:
    """The recipe's MaxText args (as a dry run builds them), the environment put back after."""
    saved = dict(os.environ)
    try:
        return PrimusRuntime(RECIPE, list(overrides)).backend_args()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def maxtext_count(args: Any) -> int:
    """MaxText's parameter count of the model its trainer builds from `args` (abstract)."""
    from maxtext.utils.max_utils import calculate_num_params_from_pytree

    _, params, _ = hf_convert.abstract_model(hf_convert.maxtext_config(args.argv))
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

    # float32 weights, gradients and adamw moments; fp32 exp(logits) + bf16 gradient; full remat
    assert state(training_job(recipe_args(), 1, frozenset())) == (4, 4, 8, 6, "full", 2)
    changed = recipe_args("weight_dtype=bfloat16", "remat_policy=minimal",
                          "gradient_accumulation_steps=2", "cast_logits_to_fp32=false")  # fmt: skip
    # bf16 weights, gradients (and their accumulator) and moments (mu_dtype follows the
    # weights'), bf16 logits
    assert state(training_job(changed, 1, frozenset())) == (2, 4, 4, 4, "selective", 4)


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


def test_the_projection_is_within_10_percent_of_the_measured_peak(tmp_path: Path) -> None:
    out = tmp_path / "projection.json"
    run = primus("projection", "memory", "--config", str(RECIPE), "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    total = json.loads(out.read_text())["bytes"]["total"] / GIB
    primus_run = json.loads(MEASURED.read_text())["primus"]
    # the device's peak_bytes_in_use (Primus's step line) and XLA's compiled estimate (MaxText's
    # "Total estimated memory size", in GiB)
    for measured in (primus_run["peak_memory_gib"], primus_run["estimated_memory_gb"]):
        assert total == pytest.approx(measured, rel=0.10), f"{total:.2f} vs {measured:.2f} GiB"


def test_gpus_the_layout_does_not_divide_exit_2_with_the_fix() -> None:
    result = primus("projection", "memory", "--config", str(RECIPE), "--gpus", "3",
                    "ici_tensor_parallelism=2")  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "--gpus 3 is not a multiple of tp 2 x pp 1 x cp 1 = 2" in result.stderr
    assert "hint: pass --gpus 2" in result.stderr and "Traceback" not in result.stderr
