"""Bad input on MaxText: over 300 bad experiments and override lists, mutated from the tiny CPU
recipe, each one config error (exit 2, file:line, no traceback) on which `config validate`
and `train --dry-run` agree; MaxText's model-build-time refusals are found at validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.backends.maxtext.config.rules import BOUNDS, RULES, mesh_rules
from primus.backends.maxtext.maxtext_adapter import MaxTextAdapter
from primus.core.config.sanity import Rules
from primus.testing.fuzz_runs import check_backend, refusal_problems, run_in_process

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "maxtext" / "tiny-cpu.yaml"
SIZES = [
    "per_device_batch_size", "max_target_length", "steps", "base_emb_dim",
    "base_num_query_heads", "base_num_kv_heads", "head_dim", "base_mlp_dim",
    "base_num_decoder_layers", "vocab_size",
]  # fmt: skip
# Passes pyconfig, fails only when MaxText builds the model: here at validation
MODEL_BUILD = {
    "kv heads do not divide query heads": ("base_num_kv_heads", [("base_num_kv_heads", 3)]),
}


# Refused by pydantic only with --full, or by MaxText's mesh once JAX has started: here at
# validation
LATER = {
    "dropout rate above 1": ("dropout_rate", [("dropout_rate", 2)]),
    "two ICI axes of -1": ("ici_data_parallelism", [("ici_data_parallelism", -1)]),
    # minutes into a run: an eval of endless synthetic data, uploads with no bucket
    "a whole-set eval of synthetic data": (
        "eval_steps",
        [("eval_interval", 2), ("eval_steps", -1)],
    ),
    "metrics to GCS from a local run": ("gcs_metrics", [("gcs_metrics", True)]),
}
CPU_MESH = "MaxText cannot lay out its mesh: the ICI parallelism"


def one_key_per_rule(rules: Rules) -> Rules:
    """The first key of each rule: MaxText's bounds and mesh keys share a few rules, each
    checked key by key in process by test_config."""
    firsts: dict[int, str] = {}
    for key, rule in rules.items():
        firsts.setdefault(id(rule), key)
    return {key: rules[key] for key in firsts.values()}


def test_every_bad_input_is_one_config_error(tmp_path, record_property) -> None:
    schema = MaxTextAdapter("maxtext").param_schema()
    shared = BOUNDS | mesh_rules(schema)
    rules = {k: r for k, r in RULES.items() if k not in shared} | one_key_per_rule(shared)
    report = check_backend(RECIPE, SIZES, MODEL_BUILD | LATER, tmp_path, rules)
    record_property("fuzz", str(report).splitlines()[0])
    print(f"\nmaxtext fuzz: {report}")
    assert not report.failures, str(report)
    assert set(RULES) <= set(schema.specs)  # each rule names a real key
    assert "ici_fsdp_parallelism" in shared and "dcn_data_parallelism" in shared


def test_model_build_refusals_are_found_at_validation_with_the_key_and_fix(tmp_path) -> None:
    assert refusal_problems(RECIPE, MODEL_BUILD | LATER, tmp_path) == []


FORCE = "--xla_force_host_platform_device_count="


@pytest.mark.parametrize(("processes", "env", "override", "error"), [
    (1, {}, "ici_fsdp_parallelism=3",
     "ICI parallelism (ici_fsdp_parallelism 3) spans 3 devices, the launch has 1 (1 process x 1 "
     "CPU device)"),
    (3, {}, "ici_tensor_parallelism=2",
     "(ici_fsdp_parallelism -1 x ici_tensor_parallelism 2) spans a multiple of 2 devices, the "
     "launch has 3 (3 processes x 1 CPU device)"),
    (1, {"XLA_FLAGS": f"{FORCE}4"}, "ici_fsdp_parallelism=3",
     "the launch has 4 (1 process x 4 CPU devices)"),
    (1, {"XLA_FLAGS": f"{FORCE}4"}, "ici_fsdp_parallelism=4", None),
    (1, {"XLA_FLAGS": f"{FORCE}2", "JAX_NUM_CPU_DEVICES": "4"}, "ici_fsdp_parallelism=4", None),
    (2, {}, "ici_tensor_parallelism=2", None),
])  # fmt: skip
def test_a_mesh_the_cpu_devices_cannot_hold_is_refused_at_the_key(
    tmp_path, processes: int, env: dict[str, str], override: str, error: str | None
) -> None:
    """The devices of a CPU launch are known before JAX starts: one a process, unless
    JAX_NUM_CPU_DEVICES or XLA_FLAGS sets a count, JAX's variable first (`train` checks its
    launch as `config validate` does)."""
    xla = {"XLA_FLAGS": None, "JAX_NUM_CPU_DEVICES": None} | env
    argv = ["config", "validate", str(RECIPE), "--nproc-per-node", str(processes), override]
    done = run_in_process(argv, tmp_path, xla)
    if error is None:
        assert done.code == 0, done.stderr[-3000:]
        return
    assert done.code == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.message.startswith(f"error: cli ({override}): {CPU_MESH}"), done.message
    assert error in done.message and "hint: make the ici_*_parallelism keys" in done.message
