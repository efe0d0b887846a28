"""The step metrics every backend reports: rates, MFU, the step line, metrics.jsonl; the glue
every backend shares: params, the enable check, the peak, the sink, the log router."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import importlib_metadata
import pytest

from primus.core.config import ParamSpec, register_params
from primus.core.config.schema import registered_params
from primus.core.config.tree import ConfigTree
from primus.core.logging import LogRouter, get_logger
from primus.core.metrics import (
    MetricsSink,
    Peak,
    append_metrics,
    find_peak,
    metrics_enabled,
    peak_tflops,
    save_measured_peak,
    step_metrics,
)
from primus.core.patches import PatchContext
from primus.core.patches.registry import PATCHES_GROUP


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
    # over the peak: the step's clock missed work that ran in another step's time (JAX's
    # asynchronous dispatch showed 893% in a MaxText run's third step): no rates are shown
    assert m.line() == (
        "step 10/20 | loss 2.5000 | lr 0.0003 | 500.0 ms/step"
        " | rates n/a (over the peak: this step's time does not cover its work)"
    )
    assert step_metrics(10, 20, 2.5, 0.5, 32768, 3.0e14, 2, 989.0).line().endswith("| MFU 30.3%")
    gpu = step_metrics(1, 2, None, 1.0, 1, 3.0e14, 1, 989.0, peak_memory_gib=27.06,
                       reserved_memory_gib=31.94).line()  # fmt: skip
    assert gpu.endswith("| peak mem 27.1 GiB (reserved 31.9)")  # a CUDA graph's pool too
    assert (
        step_metrics(1, 2, None, 1.0, 1, 3.0e14, 1, 989.0, peak_memory_gib=27.06)
        .line()
        .endswith("| peak mem 27.1 GiB")
    )  # a backend that reports no reserve
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


def ctx(params: dict, run_dir: Path | None = None, backend: str = "anybackend") -> PatchContext:
    return PatchContext(backend, "before_train", None, "0", params, run_dir=run_dir)


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def primus_log() -> Iterator[Records]:
    """What reaches Primus's own logger (whatever another test did to its handlers)."""
    records, logger = Records(), get_logger()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(records)
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


def test_metric_params_are_valid_for_every_backend_and_load_with_the_patches() -> None:
    assert any(
        ep.value == "primus.core.metrics"
        for ep in importlib_metadata.entry_points(group=PATCHES_GROUP)
    )
    schema = registered_params("a-backend-core-never-heard-of")
    assert schema.check(ConfigTree({"log_step_metrics": False, "peak_tflops": 989})) == []
    [error] = schema.check(ConfigTree({"log_step_metrics": "yes"}))
    assert "log_step_metrics: must be a boolean" in str(error)
    register_params("refining-backend", {"peak_tflops": ParamSpec(int)})
    assert registered_params("refining-backend").check(ConfigTree({"peak_tflops": 1.5}))


def test_metrics_are_on_unless_switched_off() -> None:
    assert metrics_enabled(ctx({}))
    assert not metrics_enabled(ctx({"log_step_metrics": False}))


@pytest.fixture(autouse=True)
def no_measured_peaks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty store of measured peaks (not this machine's user's)."""
    path = tmp_path / "peaks.json"
    monkeypatch.setenv("PRIMUS_PEAKS", str(path))
    return path


def test_a_measured_peak_beats_the_table_and_the_config_beats_both(
    no_measured_peaks: Path,
) -> None:
    h100 = "NVIDIA H100 80GB HBM3"
    assert save_measured_peak(h100, 712.34, "8192x8192x8192 bf16, 2026-11-25") == no_measured_peaks
    save_measured_peak("Another GPU", 100.0, "8192x8192x8192 bf16, 2026-11-25")
    peak = find_peak(None, h100)
    assert peak == Peak(712.3, "measured", h100, "8192x8192x8192 bf16, 2026-11-25")
    assert "712.3 TFLOP/s (NVIDIA H100 80GB HBM3, measured by primus benchmark gemm" in (
        peak.describe()
    )
    assert find_peak(1000.0, h100).source == "config"
    assert find_peak(None, "NVIDIA H200").source == "device table"  # others' entries: no


@pytest.mark.parametrize(
    ("configured", "device", "peak", "said"),
    [
        (
            1000.0,
            "NVIDIA H100 80GB HBM3",
            Peak(1000.0, "config", "NVIDIA H100 80GB HBM3"),
            "1000 TFLOP/s (peak_tflops)",
        ),
        (
            None,
            "NVIDIA H100 80GB HBM3",
            Peak(989.0, "device table", "NVIDIA H100 80GB HBM3"),
            "989 TFLOP/s (NVIDIA H100 80GB HBM3, by its name)",
        ),
        (
            None,
            "Some Future GPU",
            Peak(None, "unknown", "Some Future GPU"),
            "unknown for Some Future GPU, MFU n/a (set peak_tflops)",
        ),
        (None, None, Peak(None, "unknown"), "unknown for no GPU"),
    ],
)
def test_the_peak_says_where_it_came_from(configured, device, peak, said) -> None:
    assert find_peak(configured, device) == peak
    assert said in peak.describe()


def test_the_sink_finds_the_peak_once(primus_log: Records) -> None:
    sink = MetricsSink(ctx({"peak_tflops": 500.0}, backend="sinkbackend"))
    assert sink.peak("NVIDIA H100 80GB HBM3") == 500.0
    assert sink.peak("NVIDIA H100 80GB HBM3") == 500.0
    said = [r for r in primus_log.records if r.getMessage().startswith("MFU peak")]
    assert [(r.name, r.getMessage()) for r in said] == [
        ("primus.sinkbackend", "MFU peak: 500 TFLOP/s (peak_tflops)")
    ]


class Writer:
    def __init__(self) -> None:
        self.scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, scalar_value: float, global_step: int) -> None:
        self.scalars.append((tag, scalar_value, global_step))


def test_the_primary_rank_writes_metrics_jsonl_and_tensorboard(
    tmp_path, primus_log: Records, monkeypatch, capsys
) -> None:
    monkeypatch.setenv("RANK", "0")
    sink = MetricsSink(ctx({}, tmp_path / "run"))
    metrics = [step_metrics(s, 4, 2.0, 0.5, 8192, 4e15, 2, sink.peak(None)) for s in (2, 4)]
    other, writer = Writer(), Writer()
    sink.report(metrics[0], primary=False, writer=other)
    assert not (tmp_path / "run" / "metrics.jsonl").exists() and other.scalars == []
    for m in metrics:
        sink.report(m, primary=True, writer=writer)
    sink.report(metrics[0], primary=True)  # no writer: the file only
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [2, 4, 2]
    assert writer.scalars == [
        ("primus/tokens_per_s_per_gpu", 8192.0, 2),
        ("primus/tflops_per_gpu", 4000.0, 2),
        ("primus/tokens_per_s_per_gpu", 8192.0, 4),
        ("primus/tflops_per_gpu", 4000.0, 4),
    ]
    lines = [r.getMessage() for r in primus_log.records if r.getMessage().startswith("step ")]
    assert lines == [metrics[0].line(), metrics[0].line(), metrics[1].line(), metrics[0].line()]
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "3")  # the console shows rank 0's log only
    sink.report(metrics[1], primary=True)
    assert capsys.readouterr().out == f"[primus] {metrics[1].line()}\n"


def test_no_run_directory_no_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    MetricsSink(ctx({})).report(step_metrics(1, 1, 1.0, 1.0, 1, 1.0, 1, None), primary=True)
    assert list(tmp_path.iterdir()) == []


def test_the_log_router_forwards_by_level_and_source(primus_log: Records) -> None:
    upstream, other = logging.getLogger("upstream_fw"), logging.getLogger("upstream_fw.child")
    for _ in range(2):
        LogRouter("fw", logging.WARNING, {"test_metrics": logging.INFO}).attach("upstream_fw")
    assert [type(h) for h in upstream.handlers] == [LogRouter]  # attached again: replaced
    assert upstream.level == logging.INFO and not upstream.propagate
    upstream.info("ours, from this file")
    upstream.debug("below every level")
    other.info("a child's, from this file too")
    record = logging.LogRecord(
        "upstream_fw", logging.INFO, "/site-packages/lib/x.py", 1, "theirs", None, None
    )
    upstream.handle(record)
    upstream.handle(
        logging.LogRecord(
            "upstream_fw", logging.WARNING, "/lib/x.py", 1, "their warning", None, None
        )
    )
    got = [(r.name, r.getMessage()) for r in primus_log.records]
    assert got == [
        ("upstream_fw", "ours, from this file"),
        ("upstream_fw.child", "a child's, from this file too"),
        ("upstream_fw", "their warning"),
    ]
    upstream.removeHandler(upstream.handlers[0])
