"""Bad input on MaxText: over 300 bad experiments and override lists, mutated from the tiny CPU
recipe, each one config error (exit 2, file:line, no traceback) on which `config validate`
and `train --dry-run` agree; MaxText's model-build-time refusals are found at validation."""

from __future__ import annotations

from pathlib import Path

from primus.backends.maxtext.config.bridge import RULES
from primus.backends.maxtext.maxtext_adapter import MaxTextAdapter
from primus.testing.fuzz_runs import check_backend, refusal_problems

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


def test_every_bad_input_is_one_config_error(tmp_path, record_property) -> None:
    report = check_backend(RECIPE, SIZES, MODEL_BUILD, tmp_path, RULES)
    record_property("fuzz", str(report).splitlines()[0])
    print(f"\nmaxtext fuzz: {report}")
    assert not report.failures, str(report)
    schema = MaxTextAdapter("maxtext").param_schema()
    assert set(RULES) <= set(schema.specs)  # each rule names a real key


def test_model_build_refusals_are_found_at_validation_with_the_key_and_fix(tmp_path) -> None:
    assert refusal_problems(RECIPE, MODEL_BUILD, tmp_path) == []
