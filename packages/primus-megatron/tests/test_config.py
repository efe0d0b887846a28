"""Megatron's args from Primus params, against the real Megatron parser and validate_args."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus.backends.megatron.config.bridge import coerce, megatron_actions, megatron_schema
from primus.testing.runs import primus

RECIPE = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"


def action(dest: str):
    return megatron_actions()[dest]


@pytest.mark.parametrize(
    ("dest", "value", "expected"),
    [
        ("micro_batch_size", 4, 4),
        ("micro_batch_size", 4.0, 4),
        ("lr", 1, 1.0),
        ("lr", "3e-4", 3e-4),
        ("normalization", "RMSNorm", "RMSNorm"),
        ("data_path", "/data/corpus_text_document", ["/data/corpus_text_document"]),
        ("data_path", [0.3, "/a", 0.7, "/b"], ["0.3", "/a", "0.7", "/b"]),
        ("gradient_accumulation_fusion", False, False),
        ("no_persist_layer_norm", True, True),
    ],
)
def test_values_are_coerced_with_the_parsers_types(
    dest: str, value: object, expected: object
) -> None:
    result = coerce(action(dest), value)
    assert result == expected and type(result) is type(expected)


def test_enum_arguments_take_their_member_names() -> None:
    from megatron.core.transformer.enums import AttnBackend

    assert coerce(action("attention_backend"), "flash") is AttnBackend.flash
    assert megatron_schema().specs["attention_backend"].choices == tuple(
        m.name for m in AttnBackend
    )


@pytest.mark.parametrize(
    ("dest", "value", "message"),
    [
        ("micro_batch_size", 2.5, "expected an integer"),
        ("normalization", "BatchNorm", "must be one of LayerNorm, RMSNorm"),
        ("bf16", "yes", "expected true or false"),
        ("num_layers", "many", "invalid literal"),
    ],
)
def test_bad_values_are_rejected(dest: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        coerce(action(dest), value)


def test_schema_types_follow_the_parser() -> None:
    specs = megatron_schema().specs
    assert specs["num_layers"].type is int
    assert specs["lr"].type is float
    assert specs["bf16"].type is bool
    assert specs["gradient_accumulation_fusion"].type is bool  # --no-gradient-accumulation-fusion
    assert specs["data_path"].type == (list, str)
    assert "micro_batch_size" in specs and len(specs) > 700


def test_flag_spellings_get_a_hint_naming_the_key() -> None:
    hints = megatron_schema().hints
    assert hints["no_gradient_accumulation_fusion"] == (
        "--no-gradient-accumulation-fusion is written 'gradient_accumulation_fusion: false'"
    )
    assert (
        hints["disable_bias_linear"] == "--disable-bias-linear is written 'add_bias_linear: false'"
    )


@pytest.mark.slow
def test_config_errors_name_file_line_and_megatron_names(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"extends: {RECIPE}\n"
        "modules:\n"
        "  pre_trainer:\n"
        "    overrides:\n"
        "      micro_batch_sise: 2\n"
        "      no_gradient_accumulation_fusion: true\n"
        "      normalization: BatchNorm\n"
    )
    result = primus("config", "validate", str(exp), cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert (
        "exp.yaml:5: unknown parameter 'micro_batch_sise' (did you mean: micro_batch_size"
        in result.stderr
    )
    assert "exp.yaml:6: unknown parameter 'no_gradient_accumulation_fusion'" in result.stderr
    assert "written 'gradient_accumulation_fusion: false'" in result.stderr
    assert "exp.yaml:7: normalization: must be one of 'LayerNorm', 'RMSNorm'" in result.stderr


@pytest.mark.slow
def test_validate_args_failures_are_config_errors_at_the_key(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        f"extends: {RECIPE}\nmodules:\n  pre_trainer:\n    overrides:\n      log_interval: 2\n"
        "      log_memory_interval: 3\n"
    )
    result = primus("train", "pretrain", "--config", str(exp), "--dry-run", "--full", cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "Megatron rejected the arguments" in result.stderr
    assert "exp.yaml:" in result.stderr and "validate_args" in result.stderr
