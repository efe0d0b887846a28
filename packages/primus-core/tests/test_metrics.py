"""The step metrics every backend reports: rates, MFU, the step line, metrics.jsonl."""

from __future__ import annotations

import json

import pytest

from primus.core.metrics import append_metrics, peak_tflops, step_metrics


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("AMD Instinct MI300X", 1307.0),
        ("cpu", None),
    ],
)
def test_peak_by_device_name(name: str, peak: float | None) -> None:
    assert peak_tflops(name) == peak


def test_rates_and_mfu_per_gpu(tmp_path) -> None:
    # 2 GPUs, 0.5 s a step, 32,768 tokens and 4.0e15 FLOPs a step, 989 TFLOP/s peak
    m = step_metrics(10, 20, 2.5, 0.5, 32768, 4.0e15, 2, 989.0, lr=3e-4)
    assert m.tokens_per_s_per_gpu == pytest.approx(32768 / 0.5 / 2)
    assert m.tflops_per_gpu == pytest.approx(4000.0 / 0.5 / 2)
    assert m.mfu == pytest.approx(m.tflops_per_gpu / 989.0)
    assert m.line() == (
        "step 10/20 | loss 2.5000 | lr 0.0003 | 500.0 ms/step | 32,768 tokens/s/GPU"
        f" | 4000.0 TFLOP/s/GPU | MFU {m.mfu:.1%}"
    )
    cpu = step_metrics(1, 2, None, 1.0, 1, 2.34e9, 1, None).line()
    assert cpu.endswith("| 0.00234 TFLOP/s/GPU | MFU n/a")
    append_metrics(tmp_path / "run" / "metrics.jsonl", m)
    append_metrics(tmp_path / "run" / "metrics.jsonl", m)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and rows[0]["step"] == 10 and rows[0]["mfu"] == pytest.approx(m.mfu)


def test_tensorboard_scalars_name_the_rates_and_mfu_only_when_known() -> None:
    known = step_metrics(3, 10, 2.0, 0.5, 8192, 4e15, 2, 989.0)
    assert known.scalars() == {
        "primus/tokens_per_s_per_gpu": 8192.0,
        "primus/tflops_per_gpu": 4000.0,
        "primus/mfu": pytest.approx(4000.0 / 989.0),
    }
    assert "primus/mfu" not in step_metrics(3, 10, 2.0, 0.5, 8192, 4e15, 2, None).scalars()
