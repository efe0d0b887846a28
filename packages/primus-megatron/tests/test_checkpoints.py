"""`primus checkpoint preset` on Megatron: a preset derived from Llama 3.2 1B's published
config.json. (`inspect` is tested on the HF-initialised run of test_hf_checkpoints.py.) And
a `load` folder Megatron would take for one without a checkpoint, refused."""

from pathlib import Path

import pytest

from primus.testing.checkpoints import derived_preset, resolved_model
from primus.testing.fuzz_runs import assert_inputs_refused, inputs_checked
from primus.testing.hf_models import HF_CONFIGS

ARCHITECTURE = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "vocab_size", "untie_embeddings_and_output_weights", "layernorm_epsilon", "rotary_base",
    "use_rope_scaling", "rope_scaling_factor",
)  # fmt: skip


@pytest.mark.slow
def test_preset_from_hf_config_matches_the_shipped_preset(tmp_path: Path) -> None:
    derived = derived_preset("megatron", HF_CONFIGS["llama3.2_1B"], tmp_path)
    ours = resolved_model("megatron", "megatron_pretrain", derived.name, tmp_path)
    shipped = resolved_model("megatron", "megatron_pretrain", "llama3.2_1B", tmp_path)
    assert {k: ours[k] for k in ARCHITECTURE} == {k: shipped[k] for k in ARCHITECTURE}


def test_the_fixed_rope_scaling_read_from_megatrons_source_is_what_it_runs() -> None:
    """`checkpoint preset` reads Megatron's fixed Llama-3 scaling constants from its source,
    without importing it; they are the defaults of the function Megatron calls."""
    import inspect

    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from primus.backends.megatron.checkpoint.native import FIXED_SCALING, fixed_rope_scaling

    fixed = inspect.signature(RotaryEmbedding._apply_scaling).parameters
    assert fixed_rope_scaling() == {k: float(fixed[k].default) for k in FIXED_SCALING}


RECIPE = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"


def test_a_load_folder_megatron_would_start_from_random_weights_on_is_refused(
    tmp_path: Path,
) -> None:
    hf, run = tmp_path / "hf", tmp_path / "run"
    iteration = run / "checkpoints" / "iter_0000004"
    for folder in (hf, iteration):
        folder.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"x")
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("4")
    assert_inputs_refused(RECIPE, [
        ((f"load={tmp_path}/none",), "none does not exist", "remove load to start from scratch"),
        ((f"load={hf}/config.json",), "config.json is not a folder", "latest_checkpointed"),
        ((f"load={hf}",), "is an HF model, with no latest_checkpointed", "init_from: {hf: DIR}"),
        ((f"load={run}",), "is a run directory", f"set load: {run / 'checkpoints'}"),
        ((f"load={iteration}",), "is one iteration of", f"set load: {run / 'checkpoints'}"),
    ])  # fmt: skip
    inputs_checked(RECIPE, f"load={run / 'checkpoints'}")
    inputs_checked(RECIPE, f"load={tmp_path}")  # no checkpoint yet: Megatron starts afresh
    inputs_checked(RECIPE, f"load={tmp_path}/new", f"save={tmp_path}/new")  # the first run saves
