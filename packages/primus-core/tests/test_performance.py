"""The performance projection's arithmetic against hand-computed cases, the layout ranking, and
the rates read from `primus benchmark`'s JSON (the backends' tests compare it with measured
runs)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from primus.core.errors import ConfigError
from primus.core.projection import GIB, Job, Model, project
from primus.core.projection.performance import (
    HEADROOM,
    device_rates,
    micro_batches,
    project_step,
    rank_layouts,
    rates_for,
)

MODEL = Model(layers=4, hidden=1024, heads=16, kv_heads=4, head_dim=64, ffn=4096, vocab=32000)
JOB = Job(model=MODEL, micro_batch=2, seq_len=2048, global_batch=16, fused_kernels=True)
H100 = device_rates("NVIDIA H100 80GB HBM3")


def test_gemms_and_flash_attention_by_hand() -> None:
    step = project_step(JOB, H100)
    tokens, h = 2 * 2048, 1024
    q, kv = 16 * 64, 4 * 64
    layer = 2 * tokens * h * ((q + 2 * kv) + q + 2 * 4096 + 4096)
    logits = 2 * tokens * 32000 * h
    count = 16 // 2  # micro batches of one data-parallel rank
    gemm_ms = 3 * (4 * layer + logits) * count / (H100.gemm_tflops * 1e12) * 1e3
    assert step.gemm == pytest.approx(gemm_ms)
    attention = 2 * 2 * 16 * 2048**2 * 64  # forward, causal: half of QK^T and PV
    attention_ms = 3.5 * attention * 4 * count / (H100.attention_tflops * 1e12) * 1e3
    assert step.attention == pytest.approx(attention_ms)
    assert step.tensor_parallel == step.data_parallel == step.pipeline_bubble == 0


def test_an_moe_token_runs_the_mlp_of_each_expert_it_picks() -> None:
    moe = replace(MODEL, experts=8, experts_per_token=2)
    dense, routed = project_step(JOB, H100), project_step(replace(JOB, model=moe), H100)
    tokens = 2 * 2048
    mlp = 2 * tokens * 1024 * (2 * 4096 + 4096)  # up (gate and up) and down, one expert
    extra = 3 * 4 * mlp * 8 / (H100.gemm_tflops * 1e12) * 1e3  # a second expert: 4 layers, 8
    assert routed.gemm == pytest.approx(dense.gemm + extra)  # micro batches, forward + backward
    assert routed.memory_bound > dense.memory_bound


def test_full_recompute_runs_each_forward_again() -> None:
    plain, full = project_step(JOB, H100), project_step(replace(JOB, recompute="full"), H100)
    assert full.gemm == pytest.approx(plain.gemm * 4 / 3)
    assert full.attention == pytest.approx(plain.attention * 4.5 / 3.5)
    assert full.step > plain.step


def test_alternate_matmuls_runs_the_unsaved_matmuls_and_elementwise_ops_again() -> None:
    plain = project_step(JOB, H100)
    alternate = project_step(replace(JOB, recompute="alternate_matmuls", fused_qkv=True), H100)
    tokens, h, q = 2 * 2048, 1024, 16 * 64
    again = 2 * tokens * (q * h + h * 4096)  # the 2nd and 4th: attention output, MLP up
    count = 16 // 2
    extra = 4 * again * count / (H100.gemm_tflops * 1e12) * 1e3
    assert alternate.gemm == pytest.approx(plain.gemm + extra)
    assert alternate.attention == pytest.approx(plain.attention)  # its output is kept
    assert alternate.memory_bound == pytest.approx(plain.memory_bound * 4 / 3)


def test_the_host_bounds_an_eager_step_and_a_cuda_graph_lifts_it() -> None:
    eager = project_step(replace(JOB, host_ms_per_layer=50.0), H100)
    assert eager.host_floor == pytest.approx(50.0 * 4 * 8)
    assert eager.step == eager.host_floor
    graphed = project_step(replace(JOB, host_ms_per_layer=50.0, cuda_graphs=True), H100)
    assert graphed.host_floor == 0 and graphed.step < eager.step


def test_data_parallel_gradients_are_exposed_unless_overlapped() -> None:
    job = replace(JOB, dp=4, global_batch=32)
    ring = 2 * 3 / 4 * project(job).parameters_per_gpu * job.grad_bytes
    assert project_step(job, H100).data_parallel == pytest.approx(ring / 360e9 * 1e3)
    assert project_step(replace(job, overlap_grad_reduce=True), H100).data_parallel == 0


@pytest.mark.parametrize("dp", [1, 4])
def test_sharded_weights_wait_for_the_collectives_at_the_models_ends(dp: int) -> None:
    job = replace(JOB, zero=3, dp=dp, global_batch=16 * dp, overlap_grad_reduce=True)
    layer = 2 * 1024 * (16 * 64) + 2 * 1024 * (4 * 64) + 3 * 1024 * 4096 + 2 * 1024
    ends = 32000 * 1024 + 2 * layer  # the tied embedding, the first and the last layer
    bus = ends * (2 + 4) * (dp - 1) / dp  # gathered in bf16, reduced in fp32
    step = project_step(job, H100)
    assert step.data_parallel == pytest.approx(bus * 8 / 360e9 * 1e3)  # 8 micro batches
    assert (step.data_parallel > 0) == (dp > 1)


def test_a_backends_measured_passes_and_attention_rate_replace_the_defaults() -> None:
    eager = project_step(replace(JOB, fused_kernels=False), H100)
    three = project_step(replace(JOB, elementwise_passes=3.0), H100)
    fused, flex = (
        project_step(JOB, H100),
        project_step(replace(JOB, attention_rate_share=0.5), H100),
    )
    assert eager.memory_bound > three.memory_bound > fused.memory_bound  # the loss stays fused
    assert flex.attention == pytest.approx(2 * fused.attention)


@pytest.mark.parametrize("dp", [1, 4])
def test_fsdp_casts_each_gpus_shard_of_fp32_weights_for_both_gathers(dp: int) -> None:
    fp32 = replace(JOB, weight_bytes=4, grad_bytes=4, dp=dp, global_batch=16 * dp)
    sharded, whole = project_step(replace(fp32, zero=3), H100), project_step(fp32, H100)
    shard = project(fp32).parameters_per_gpu / dp
    cast_ms = 2 * shard * (4 + 2) * 8 / (H100.memory_gbs * 1e9) * 1e3  # 8 micro batches
    assert sharded.memory_bound - whole.memory_bound == pytest.approx(cast_ms)


def test_a_pipeline_idles_pp_minus_one_micro_batches() -> None:
    step = project_step(replace(JOB, pp=2, host_ms_per_layer=0.0), H100)
    per_micro_batch = (step.gemm + step.attention + step.memory_bound + step.kernel_gaps) / 8
    assert step.pipeline_bubble == pytest.approx(per_micro_batch)


def test_tokens_and_mfu_follow_from_the_step() -> None:
    step = project_step(replace(JOB, dp=2, global_batch=16), H100)
    assert step.tokens_per_s_per_gpu == pytest.approx(16 * 2048 / 2 / (step.step / 1e3))
    assert step.mfu == pytest.approx(step.model_tflops_per_gpu / 989.0)


def test_a_global_batch_the_layout_cannot_split_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"global batch \(10\) is not a multiple of micro batch 2 x data parallel 2"):  # fmt: skip
        micro_batches(replace(JOB, dp=2, global_batch=10))


def test_an_unknown_device_names_the_known_ones() -> None:
    with pytest.raises(ConfigError) as error:
        device_rates("Quantum 9000")
    assert "H100" in str(error.value.hint) and "MI300X" in str(error.value.hint)


def test_the_ranking_holds_every_fitting_layout_fastest_first() -> None:
    ranked = rank_layouts(JOB, 8, H100)
    steps = [c.step.step for c in ranked]
    assert steps == sorted(steps)
    layouts = {(c.job.tp, c.job.pp, c.job.micro_batch, c.job.recompute) for c in ranked}
    # tp: 1, 2, 4 (4 KV heads); pp: 1, 2, 4 (4 layers); micro batches dividing 16 / dp
    assert {tp for tp, *_ in layouts} == {1, 2, 4} and {pp for _, pp, *_ in layouts} == {1, 2, 4}
    assert (1, 1, 2, "none") in layouts and (4, 1, 16, "full") not in layouts
    for c in ranked:
        assert c.job.gpus == 8 and c.job.sequence_parallel == (c.job.tp > 1)
        assert c.memory_gib == pytest.approx(project(c.job).total / GIB)
    small = replace(H100, memory_gib=2.0)
    assert all(c.memory_gib <= 2.0 * (1 - HEADROOM) for c in rank_layouts(JOB, 8, small))
    assert len(rank_layouts(JOB, 8, small)) < len(ranked)


def _benchmark_json(path: Path, device: str, ops: list[tuple[str, float, float]]) -> Path:
    """A `primus benchmark gemm --json` record: (name, median ms, TFLOP/s) per op."""
    rows = [{"op": {"name": n, "m": 1, "n": 1, "k": 1}, "median_ms": ms, "tflops": t}
            for n, ms, t in ops]  # fmt: skip
    path.write_text(json.dumps({"device": device, "dtype": "bf16", "ops": rows}))
    return path


def test_measured_rates_replace_the_tables(tmp_path: Path) -> None:
    gemms = _benchmark_json(tmp_path / "g.json", "NVIDIA H100 80GB HBM3",
                            [("qkv", 1.0, 600.0), ("mlp_up", 3.0, 700.0)])  # fmt: skip
    buses = tmp_path / "c.json"
    rows = [{"op": "all_reduce", "busbw_gbs": 300.0}, {"op": "all_gather", "busbw_gbs": 999.0},
            {"op": "all_reduce", "busbw_gbs": 350.0}]  # fmt: skip
    buses.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "ranks": 8, "rows": rows}))
    rates = rates_for("NVIDIA H100 80GB HBM3", [gemms, buses])
    assert rates.gemm_tflops == pytest.approx((600 * 1 + 700 * 3) / 4)  # weighted by time
    assert rates.bus_gbs == 350.0 and rates.attention_tflops == H100.attention_tflops
    assert "measured (bus_gbs, gemm_tflops)" in rates.source
    assert rates_for(None, [gemms]).device == "NVIDIA H100 80GB HBM3"  # the files' device
    assert rates_for(None, []).source == "device table" and rates_for(None, []).device == "H100"


def test_rates_measured_on_another_device_are_refused(tmp_path: Path) -> None:
    other = _benchmark_json(tmp_path / "g.json", "NVIDIA H200", [("qkv", 1.0, 600.0)])
    with pytest.raises(ConfigError, match="measured on 'NVIDIA H200', not on 'NVIDIA H100"):
        rates_for("NVIDIA H100 80GB HBM3", [other])
    one_rank = tmp_path / "c.json"
    rows = [{"op": "all_reduce", "busbw_gbs": 0.0}]
    one_rank.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "ranks": 1, "rows": rows}))
    with pytest.raises(ConfigError, match="collectives over one rank say nothing of the bus"):
        rates_for("H100", [one_rank])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a primus benchmark JSON"):
        rates_for("H100", [tmp_path / "bad.json"])
    with pytest.raises(ConfigError, match=r"not a primus benchmark JSON \(no device named\)"):
        rates_for(None, [tmp_path / "bad.json"])  # its device unread
    (tmp_path / "text.json").write_text("device: H100")
    with pytest.raises(ConfigError, match=r"text\.json: not JSON: Expecting value"):
        rates_for(None, [tmp_path / "text.json"])


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"ops": 3}, "'ops' is not a list of benchmark rows"),
        ({"ops": [{}]}, r"ops\[0\] names no op"),
        ({"ops": [{"op": {"name": "qkv"}, "median_ms": 1.0, "tflops": "x"}]}, r"tflops is 'x'"),
        ({"ops": [{"op": {"name": "qkv"}, "median_ms": 0, "tflops": 5.0}]}, r"median_ms is 0"),
        ({"ops": [{"op": {"name": "qkv"}, "median_ms": 1.0, "tflops": -5.0}]}, r"tflops is -5"),
        ({"ranks": 8, "rows": [{"op": "all_reduce", "busbw_gbs": float("nan")}]}, "is nan"),
        ({"ranks": "8", "rows": []}, "ranks is '8', not a positive integer"),
    ],
)
def test_malformed_measured_rows_are_one_config_error(tmp_path: Path, record, why) -> None:
    """A hand-edited or foreign `--measured` file: a ConfigError naming the row at fault, not a
    KeyError, a division by zero or a negative GEMM time."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"device": "H100", **record}))
    with pytest.raises(ConfigError, match=why):
        rates_for("H100", [path])
