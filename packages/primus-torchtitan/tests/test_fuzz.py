"""Bad input on TorchTitan: over 300 bad experiments and override lists, mutated from the tiny CPU
recipe, each one config error (exit 2, file:line, no traceback) on which `config validate`
and `train --dry-run` agree; TorchTitan's model-build-time refusals are found at validation."""

from __future__ import annotations

from pathlib import Path

from primus.backends.torchtitan.config.bridge import RULES
from primus.backends.torchtitan.torchtitan_adapter import TorchTitanAdapter
from primus.testing.fuzz_runs import check_backend, refusal_problems

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


def test_every_bad_input_is_one_config_error(tmp_path, record_property) -> None:
    report = check_backend(RECIPE, SIZES, MODEL_BUILD, tmp_path, RULES)
    record_property("fuzz", str(report).splitlines()[0])
    print(f"\ntorchtitan fuzz: {report}")
    assert not report.failures, str(report)
    schema = TorchTitanAdapter("torchtitan").param_schema()
    assert set(RULES) <= set(schema.specs)  # each rule names a real key


def test_model_build_refusals_are_found_at_validation_with_the_key_and_fix(tmp_path) -> None:
    assert refusal_problems(RECIPE, MODEL_BUILD, tmp_path) == []
