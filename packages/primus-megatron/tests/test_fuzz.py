"""Bad input on Megatron: over 300 bad experiments and override lists, mutated from the tiny CPU
recipe, each one config error (exit 2, file:line, no traceback) on which `config validate`
and `train --dry-run` agree; Megatron's model-build-time refusals are found at validation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from primus.backends.megatron.config.checks import RULES
from primus.backends.megatron.megatron_adapter import MegatronAdapter
from primus.testing.fuzz import EXPERIMENT, Case
from primus.testing.fuzz_runs import check_backend, refusal_problems, run_case

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
SIZES = [
    "micro_batch_size", "global_batch_size", "train_iters", "seq_length", "num_layers",
    "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "max_position_embeddings", "vocab_size", "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
]  # fmt: skip
# Refused by Megatron's validate_args, or only when it builds the model or its scheduler: here
# without importing Megatron
MODEL_BUILD = {
    "heads do not divide hidden": ("num_attention_heads", [("num_attention_heads", 3)]),
    "tensor parallel does not divide heads": (
        "tensor_model_parallel_size",
        [("tensor_model_parallel_size", 3)],
    ),
    "query groups neither a multiple nor a divisor of tensor parallel": (
        "tensor_model_parallel_size",
        [
            ("hidden_size", 96),
            ("num_attention_heads", 6),
            ("num_query_groups", 3),
            ("tensor_model_parallel_size", 2),
        ],
    ),
    "query groups do not divide the heads": ("num_query_groups", [("num_query_groups", 3)]),
    "a virtual pipeline over one pipeline stage": (
        "num_layers_per_virtual_pipeline_stage",
        [("num_layers_per_virtual_pipeline_stage", 1)],
    ),
    "virtual stages that do not split a stage's layers": (
        "num_layers_per_virtual_pipeline_stage",
        [("num_layers_per_virtual_pipeline_stage", 3)],
    ),
    "two ways of virtual stages": (
        "num_layers_per_virtual_pipeline_stage",
        [("num_layers_per_virtual_pipeline_stage", 1), ("num_virtual_stages_per_pipeline_rank", 2)],
    ),
    "sequence above the position embeddings": ("seq_length", [("seq_length", 256)]),
    "no model size": ("num_layers", [("num_layers", None)]),
    "fp16 and bf16": ("bf16", [("fp16", True), ("bf16", True)]),
    "pipeline parallel does not divide layers": (
        "pipeline_model_parallel_size",
        [("pipeline_model_parallel_size", 3)],
    ),
    "context parallel does not divide the sequence": (
        "context_parallel_size",
        [("context_parallel_size", 3)],
    ),
    "sequence parallel, torch norm": (
        "sequence_parallel",
        [("tensor_model_parallel_size", 2), ("sequence_parallel", True)],
    ),
    "global batch not a multiple of the micro batch": (
        "global_batch_size",
        [("global_batch_size", 6)],
    ),
    "train_samples beside train_iters": ("train_samples", [("train_samples", 100)]),
    "no run length": ("train_iters", [("train_iters", None)]),
    "iteration warm-up in a run of samples": (
        "lr_warmup_iters",
        [("train_iters", None), ("train_samples", 1000)],
    ),
    "warm-up fraction beside warm-up iterations": (
        "lr_warmup_fraction",
        [("lr_warmup_fraction", 0.1)],
    ),
    # OptimizerParamScheduler's asserts, a traceback when training starts
    "minimum lr above lr": ("min_lr", [("min_lr", 0.1)]),
    "warm-up as long as the run": ("lr_warmup_iters", [("train_iters", 2)]),
    "warm-up fraction of 1": (
        "lr_warmup_fraction",
        [("lr_warmup_iters", 0), ("lr_warmup_fraction", 1.0)],
    ),
    "warm-up start above lr": ("lr_warmup_init", [("lr_warmup_init", 1.0)]),
    # the first evaluation, minutes into the run
    "evaluation with no validation split": (
        "eval_iters",
        [
            ("mock_data", False),
            ("data_path", ["s3://bucket/corpus"]),
            ("tokenizer_type", "NullTokenizer"),
            ("split", "100,0,0"),
            ("eval_iters", 2),
        ],
    ),
    # not refused at all: without the loader's mask, attention would cross the documents
    "document masks without the mask": ("reset_attention_mask", [("reset_attention_mask", True)]),
}
# Refused by Megatron's options as Primus hands them over, not by its model build
JUNK = {
    "data_path a list of lists": [("data_path", [[1, 2], {"fuzz": 1}])],
    "a null Megatron has no unset value for": [("bf16", None)],
}


@pytest.fixture(autouse=True, scope="module")
def no_cpu_mode_left_behind() -> Iterator[None]:
    """The cases run the `megatron.cpu` patch in this process, which enters its CUDA-to-CPU
    torch function mode for the rest of the process (a run's): leave none to later tests (under
    it, torch.compile of the turbo kernels recursed)."""
    import torch

    depth = torch._C._len_torch_function_stack()
    yield
    while torch._C._len_torch_function_stack() > depth:
        torch._C._pop_torch_function_stack()


def test_every_bad_input_is_one_config_error(tmp_path, record_property) -> None:
    report = check_backend(RECIPE, SIZES, MODEL_BUILD, tmp_path, RULES, JUNK)
    record_property("fuzz", str(report).splitlines()[0])
    print(f"\nmegatron fuzz: {report}")
    assert not report.failures, str(report)
    schema = MegatronAdapter("megatron").param_schema()
    assert set(RULES) <= set(schema.specs)  # each rule names a real key


def test_model_build_refusals_are_found_at_validation_with_the_key_and_fix(tmp_path) -> None:
    assert refusal_problems(RECIPE, MODEL_BUILD, tmp_path) == []


def test_a_module_without_a_model_is_refused_at_validation(tmp_path) -> None:
    tree = yaml.safe_load(RECIPE.read_text())
    tree["workspace"] = "ws"
    tree["modules"]["pre_trainer"]["model"] = None  # no architecture: no num_layers & co.
    case = Case("no model", {EXPERIMENT: yaml.safe_dump(tree).encode()}, at="num_layers is not set")
    problems, _ = run_case(case, tmp_path)
    assert problems == []
