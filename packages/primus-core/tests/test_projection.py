"""The memory projection's arithmetic (primus.core.projection) against hand-computed cases."""

from __future__ import annotations

import pytest

from primus.core.errors import ConfigError
from primus.core.projection import Job, Model, data_parallel, project

# 2 layers, hidden 8, 2 heads of 4, 1 KV head, SwiGLU width 16, vocabulary 32
TINY = Model(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, ffn=16, vocab=32)
# a layer: q and o 8x8 each, k and v 8x4 each (192); gate, up, down 8x16 each (384); 2 norms (16)
LAYER = 192 + 384 + 16
EMBEDDING = 32 * 8


def test_the_parameter_count_is_the_sum_of_the_matrices() -> None:
    assert TINY.parameters() == 2 * LAYER + EMBEDDING + 8  # + the final norm
    untied = Model(**{**TINY.__dict__, "tied": False})
    assert untied.parameters() == TINY.parameters() + EMBEDDING


def test_one_gpu_holds_everything_at_its_bytes() -> None:
    job = Job(TINY, micro_batch=2, seq_len=4)  # bf16 weights, fp32 grads, 12 optimizer bytes
    p = project(job)
    n = TINY.parameters()
    assert (p.parameters_per_gpu, p.weights, p.gradients, p.optimizer) == (n, 2 * n, 4 * n, 12 * n)
    # per token and layer: norms 4 x 8, q + o 2 x 8, k + v 2 x 4, MLP 3 x 16 = 104 elements
    assert p.activations == 2 * 8 * 104 * 2  # 2 layers x 8 tokens x 104 x 2 bytes
    assert p.logits == 8 * 32 * 6
    assert p.total == p.weights + p.gradients + p.optimizer + p.activations + p.logits


def test_attention_probabilities_without_a_flash_kernel_unless_recomputed() -> None:
    flash = project(Job(TINY, micro_batch=1, seq_len=4))
    eager = project(Job(TINY, micro_batch=1, seq_len=4, flash_attention=False))
    # 2 heads x 4 keys per token, 4 tokens, 2 layers, 2 bytes
    assert eager.activations - flash.activations == 2 * 4 * 4 * 2 * 2
    selective = Job(TINY, micro_batch=1, seq_len=4, flash_attention=False, recompute="selective")
    assert project(selective).activations == flash.activations


def test_full_recompute_keeps_the_layer_inputs_and_one_layer() -> None:
    p = project(Job(TINY, micro_batch=1, seq_len=4, recompute="full"))
    assert p.activations == 2 * 4 * 8 * 2 + 4 * 104 * 2


def test_full_recompute_holds_the_backends_working_set_of_layers() -> None:
    p = project(Job(TINY, micro_batch=1, seq_len=4, recompute="full", recompute_working_set=2))
    assert p.activations == 2 * 4 * 8 * 2 + 2 * 4 * 104 * 2


def test_projections_recompute_keeps_the_projections_outputs() -> None:
    # per token and layer: q 8, k + v 2 x 4, gate + up 2 x 16, attention output + down 2 x 8
    p = project(Job(TINY, micro_batch=1, seq_len=4, recompute="projections"))
    assert p.activations == 2 * 4 * (8 + 8 + 32 + 16) * 2
    # tensor parallel splits q, k, v, gate and up; sequence parallel the two outputs too
    mha = Model(**{**TINY.__dict__, "kv_heads": 2})
    tp = project(Job(mha, micro_batch=1, seq_len=4, tp=2, recompute="projections"))
    assert tp.activations == 2 * 4 * ((8 + 16 + 32) / 2 + 16) * 2
    sp = Job(mha, micro_batch=1, seq_len=4, tp=2, sequence_parallel=True, recompute="projections")
    assert project(sp).activations == 2 * 4 * (8 + 16 + 32 + 16) / 2 * 2


def test_alternate_matmuls_keeps_every_second_matmul_and_the_attention() -> None:
    # matmuls in order: q 8, k 4, v 4, o 8, gate 16, up 16, down 8: the 1st, 3rd, 5th and 7th
    # kept (8 + 4 + 16 + 8), with the layer input 8, the attention output 8 (2 bytes each) and
    # its fp32 log-sum-exp for 2 heads: 2 layers x 4 tokens
    p = project(Job(TINY, micro_batch=1, seq_len=4, recompute="alternate_matmuls"))
    assert p.activations == 2 * 4 * ((36 + 8 + 8) * 2 + 2 * 4)
    # fused: qkv 16, o 8, gate 16, up 16, down 8: qkv, gate and down kept
    fused = Job(TINY, micro_batch=1, seq_len=4, recompute="alternate_matmuls", fused_qkv=True)
    assert project(fused).activations == 2 * 4 * ((40 + 8 + 8) * 2 + 2 * 4)


def test_tensor_parallel_splits_matrices_and_sequence_parallel_the_norms() -> None:
    mha = Model(**{**TINY.__dict__, "kv_heads": 2})  # k and v 8x8: attention 256, 80 split
    p = project(Job(mha, micro_batch=1, seq_len=4, tp=2))
    assert p.parameters_per_gpu == 2 * ((256 + 384) / 2 + 16) + EMBEDDING / 2 + 8
    assert p.activations == 2 * 4 * (32 + 80 / 2) * 2  # norms whole, the rest halved
    assert p.logits == 4 * 16 * 6
    sp = project(Job(mha, micro_batch=1, seq_len=4, tp=2, sequence_parallel=True))
    assert sp.activations == 2 * 4 * (32 + 80) / 2 * 2


def test_zero_stages_shard_state_over_data_parallel_ranks() -> None:
    n = TINY.parameters()
    stages = [project(Job(TINY, 1, 4, dp=4, zero=z)) for z in (0, 1, 2, 3)]
    assert [(s.weights, s.gradients, s.optimizer) for s in stages] == [
        (2 * n, 4 * n, 12 * n),
        (2 * n, 4 * n, 3 * n),
        (2 * n, n, 3 * n),
        (n / 2, n, 3 * n),
    ]


def test_hsdp_shards_over_the_ranks_of_one_replica() -> None:
    n = TINY.parameters()
    p = project(Job(TINY, 1, 4, dp=4, zero=3, zero_replicas=2))  # 2 copies, each over 2 ranks
    assert (p.weights, p.gradients, p.optimizer) == (n, 2 * n, 6 * n)


def test_lora_gives_gradients_and_optimizer_state_to_the_adapters_only() -> None:
    n, adapters = TINY.parameters(), 100
    p = project(Job(TINY, 1, 4, adapter_parameters=adapters))
    assert (p.parameters_per_gpu, p.weights) == (n + adapters, 2 * (n + adapters))
    assert (p.gradients, p.optimizer) == (4 * adapters, 12 * adapters)
    fsdp = project(Job(TINY, 1, 4, dp=4, zero=3, adapter_parameters=adapters))
    assert (fsdp.weights, fsdp.gradients, fsdp.optimizer) == ((n + adapters) / 2, 100, 300)


def test_a_second_copy_of_a_tied_embedding_adds_to_the_weights() -> None:
    plain = project(Job(TINY, 1, 4, dp=2, zero=3))
    copied = project(Job(TINY, 1, 4, dp=2, zero=3, tied_copy_bytes=4))
    assert copied.weights - plain.weights == EMBEDDING / 2 * 4  # sharded like the weights
    assert copied.gradients == plain.gradients and copied.optimizer == plain.optimizer
    untied = Model(**{**TINY.__dict__, "tied": False})
    assert project(Job(untied, 1, 4, tied_copy_bytes=4)) == project(Job(untied, 1, 4))


def test_the_loss_holds_output_layer_bytes_and_freed_gradients_take_the_larger_part() -> None:
    """14 bytes an output-layer element (32 x 8) in the loss; with the gradients freed between
    steps the peak holds weights (2 x 1448) and optimizer state (12 x 1448), and the larger of
    the gradients (4 x 1448 = 5792) and activations with the loss."""
    kept = project(Job(TINY, micro_batch=2, seq_len=4, loss_output_layer_bytes=14))
    assert kept.output_layer == 32 * 8 * 14 == 3584
    forward = 3328 + 1536 + 3584  # activations 2 x 8 x 104 x 2, logits 8 x 32 x 6, output layer
    assert kept.total == 2896 + 17376 + 5792 + forward
    freed = project(Job(TINY, micro_batch=2, seq_len=4, loss_output_layer_bytes=14,
                        gradients_kept=False))  # fmt: skip
    assert freed.total == 2896 + 17376 + forward  # 8448 > 5792: no gradient at the peak
    assert freed.as_dict()["total"] == freed.total and "gradients_kept" not in freed.as_dict()
    sharded = Job(TINY, micro_batch=2, seq_len=4, dp=4, zero=3, loss_output_layer_bytes=10,
                  loss_output_layer_sharded_bytes=4)  # fmt: skip
    assert project(sharded).output_layer == 32 * 8 * (10 + 4 / 4)  # the reduced shard, a quarter
    small = project(Job(TINY, micro_batch=1, seq_len=4, gradients_kept=False))
    assert (small.activations, small.logits) == (1664, 768)  # 2432 < 5792: the gradients
    assert small.total == 2896 + 17376 + 5792


def test_the_first_pipeline_stage_holds_pp_micro_batches_and_the_last_the_logits() -> None:
    job = Job(TINY, micro_batch=1, seq_len=4, pp=2, logit_bytes=0)
    p = project(job)  # no logits: the first stage (embedding, 2 micro batches of 1 layer)
    assert p.parameters_per_gpu == LAYER + EMBEDDING
    assert p.activations == 2 * 4 * 104 * 2 and p.logits == 0
    last = project(Job(TINY, micro_batch=1, seq_len=4, pp=2, logit_bytes=1000))
    # tied: the last stage keeps its own copy of the embedding as the output layer
    assert last.parameters_per_gpu == LAYER + 8 + EMBEDDING
    assert last.logits == 4 * 32 * 1000 and last.activations == 4 * 104 * 2


def test_moe_layers_split_experts_over_expert_parallel_ranks() -> None:
    moe = Model(**{**TINY.__dict__, "experts": 4, "experts_per_token": 2})
    p = project(Job(moe, micro_batch=1, seq_len=4, ep=2))
    router = 8 * 4
    assert p.parameters_per_gpu == 2 * (192 + 16 + router + 384 * 4 / 2) + EMBEDDING + 8
    assert p.activations == 2 * 4 * (32 + 24 + 2 * 48) * 2  # each token runs 2 experts' MLPs


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tp": 3}, "attention heads (2) do not split into 3"),
        ({"tp": 2, "model": Model(**{**TINY.__dict__, "heads": 4})}, "KV heads (1) do not split"),
        ({"pp": 3}, "layers (2) do not split into 3"),
        ({"ep": 2}, "experts (0) do not split into 2"),
        ({"dp": 4, "zero_replicas": 3}, "data-parallel ranks (4) do not split into 3"),
        (
            {"recompute": "some"},
            "recompute 'some' is not one of none, selective, alternate_matmuls, projections, full",
        ),
    ],
)
def test_a_layout_the_model_cannot_take_is_a_config_error(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        project(Job(**{"model": TINY, "micro_batch": 1, "seq_len": 4, **changes}))


def test_data_parallel_fills_the_gpus_or_says_what_divides() -> None:
    assert data_parallel(16, tp=2, pp=2) == 4
    with pytest.raises(ConfigError, match="--gpus 6 is not a multiple of tp 4 x pp 1 x cp 1"):
        data_parallel(6, tp=4)


def test_a_layout_that_does_not_fit_is_said_to_before_its_times() -> None:
    from primus.cli.projection_cmd import _fit
    from primus.core.projection.performance import rates_for

    h100 = rates_for("H100", [])
    assert _fit(67.9, h100, 10).endswith("of H100's 80 GiB")
    assert _fit(94.0, h100, 10) == (
        "memory: 94.0 GiB on the most loaded GPU (primus projection memory): DOES NOT FIT "
        "H100's 80 GiB less 15% headroom (68 GiB); the times below are for a run that would end "
        "out of memory (the layouts below fit)"
    )
    assert _fit(94.0, h100, 0).endswith("(--top lists layouts that fit)")
