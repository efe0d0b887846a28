"""MaxText's sanity rules (`primus.core.config.sanity`), checked without importing MaxText: the
bounds its config model declares (pydantic's `Field(ge=0, le=1)` and the like, which only
`--full` would otherwise apply; test_config checks them against `MaxTextConfig`), and what it
takes on trust and fails on later, or trains nothing on."""

from __future__ import annotations

from primus.backends.maxtext.config.mesh import AXIS_KEY
from primus.core.config import ParamSchema
from primus.core.config.sanity import (
    FRACTION,
    LEARNING_RATE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Rule,
    Rules,
    is_number,
    positive_or_minus_one,
)

POSITIVE_UNIT = Rule("a number in (0, 1]", lambda v: is_number(v) and 0 < v <= 1, refuses=(0, 2))

# MaxTextConfig's bounds: gt=0 (and ge=1 on integers), ge=0, [0, 1], (0, 1]
BOUNDS: Rules = {
    **dict.fromkeys(
        (
            "kv_cache_buffer", "vllm_block_size", "skip_step_interval",
            "gradient_accumulation_steps", "mhc_expansion_rate", "sinkhorn_iterations",
            "num_experts", "num_experts_per_tok", "num_moe_token_chunks",
            "te_ep_overflow_check_every_n_steps", "causal_block_size", "kv_tp_size",
            "moe_mlp_tp_size",
        ),
        POSITIVE,
    ),
    **dict.fromkeys(
        (
            "swap_space_vllm_gb", "gradient_clipping_threshold",
            "num_communication_overlapping_steps", "eval_start_step", "first_num_dense_layers",
            "shared_experts", "load_balance_loss_weight", "ring_scan_unroll", "indexer_head_dim",
            "indexer_n_heads", "indexer_topk", "o_lora_rank", "o_groups", "q_lora_rank",
            "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
            "hidden_size_per_layer_input", "vocab_size_per_layer_input", "num_kv_shared_layers",
            "sliding_window_size", "chunk_attn_window_size", "mla_qk_head_chunk_size",
            "csa_qk_head_chunk_size", "mtp_num_layers", "mtp_loss_scaling_factor",
            "mtp_eval_target_module", "local_checkpoint_period",
            "replicator_backup_interval_minutes",
        ),
        NON_NEGATIVE,
    ),
    **dict.fromkeys(
        (
            "wsd_decay_steps_fraction", "warmup_steps_fraction",
            "communication_overlapping_alpha", "dropout_rate", "sharding_tolerance",
        ),
        UNIT,
    ),
    **dict.fromkeys(("hbm_utilization_vllm", "block_diffusion_min_noise"), POSITIVE_UNIT),
}  # fmt: skip

STEPS = positive_or_minus_one("the other of steps and learning_rate_schedule_steps")
# BOUNDS, and what MaxText takes on trust (stricter than its bounds where they differ).
# (`steps` and `eval_interval` are MaxText's own: -1 means "the schedule's length" and "none".)
RULES: Rules = {
    **BOUNDS,
    **dict.fromkeys(
        (
            "per_device_batch_size", "max_target_length", "base_emb_dim", "base_num_query_heads",
            "base_num_kv_heads", "head_dim", "base_mlp_dim", "base_num_decoder_layers",
            "vocab_size", "checkpoint_period", "log_period",
        ),
        POSITIVE,
    ),
    "learning_rate": LEARNING_RATE,
    # the cosine decays to learning_rate x this: above 1 it rises, below 0 it turns negative
    "learning_rate_final_fraction": UNIT,
    "adam_b1": FRACTION,
    "adam_b2": FRACTION,
    "adam_eps": NON_NEGATIVE,
    "adam_weight_decay": NON_NEGATIVE,
    **dict.fromkeys(("steps", "learning_rate_schedule_steps"), STEPS),
}  # fmt: skip

MESH_AXIS = positive_or_minus_one("the devices the other axes leave")


def mesh_rules(schema: ParamSchema) -> Rules:
    """Each ici_*/dcn_* parallelism of `schema` is a size, or -1 (MaxText's mesh asserts it)."""
    return {key: MESH_AXIS for key in schema.specs if AXIS_KEY.fullmatch(key)}
