"""`primus benchmark gemm|attention`: the job's shapes, the timing loop, the commands."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from primus.core.diagnostics import benchmark
from primus.core.diagnostics.benchmark import (
    Attention,
    Gemm,
    bus_factor,
    check_fits,
    check_messages_fit,
    job_attention,
    job_collective_sizes,
    job_gemms,
    parse_attention,
    parse_shape,
    parse_size,
    run_ops,
    timed,
)
from primus.core.errors import ConfigError
from primus.core.projection import Job, Model, project
from primus.testing.runs import primus

PNG = b"\x89PNG\r\n\x1a\n"
MODEL = Model(layers=2, hidden=8, heads=4, kv_heads=2, head_dim=2, ffn=16, vocab=32)


def test_a_jobs_gemms_are_one_gpus_share_of_each_matrix() -> None:
    job = Job(MODEL, micro_batch=2, seq_len=6, tp=2, cp=3)  # 4 tokens a GPU
    assert job_gemms(job) == [
        Gemm("qkv", 4, (8 + 2 * 4) // 2, 8),
        Gemm("attention_out", 4, 8, 8 // 2),
        Gemm("mlp_up", 4, 2 * 16 // 2, 8),
        Gemm("mlp_down", 4, 8, 16 // 2),
        Gemm("logits", 4, 32 // 2, 8),
    ]
    assert Gemm("x", 4, 5, 6).flops == 240
    assert job_attention(job) == Attention("attention", 2, 2, 1, 2, 2)
    assert Attention("a", 2, 4, 2, 8, 16).flops == 2 * 2 * 4 * 8 * 8 * 16  # half of QK^T and PV


@pytest.mark.parametrize("text", ["12x3", "0x4x4", "axbxc", "4x4x4x4", "4x-4x4", "\u0663x4x4"])
def test_a_shape_that_is_not_mxnxk_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="is not MxNxK"):
        parse_shape(text)


def test_an_attention_shape_is_five_sizes_with_heads_shared_evenly() -> None:
    assert parse_attention("1x32x8x4096x64") == Attention("1x32x8x4096x64", 1, 32, 8, 4096, 64)
    with pytest.raises(ConfigError, match="32 heads do not share 5 KV heads evenly"):
        parse_attention("1x32x5x4096x64")
    with pytest.raises(ConfigError, match="is not BxHxKVxSxD"):
        parse_attention("1x32x8x4096")


def test_the_timing_loop_warms_up_untimed_then_times_each_repeat() -> None:
    calls = []

    def work() -> None:
        calls.append(None)
        time.sleep(0.02 if len(calls) <= 2 else 0.005)  # two slow warm-up calls

    times = timed(None, False, work, repeats=4, warmup=2)
    assert len(calls) == 6 and len(times) == 4
    assert all(5 <= t < 15 for t in times), times


def test_the_command_times_given_shapes_and_writes_json(tmp_path: Path) -> None:
    result = primus("benchmark", "gemm", "--shape", "64x32x16", "--dtype", "fp32",
                    "--repeats", "3", "--json", str(tmp_path / "g.json"), "--plot",
                    str(tmp_path / "g.png"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "g.png").read_bytes().startswith(PNG)
    assert "64x32x16" in result.stdout and "device cpu, fp32" in result.stdout
    record = json.loads((tmp_path / "g.json").read_text())
    [gemm] = record["ops"]
    assert gemm["flops"] == 2 * 64 * 32 * 16 and gemm["tflops"] > 0
    assert gemm["min_ms"] <= gemm["median_ms"] <= gemm["max_ms"]
    assert gemm["peak_pct"] is None  # no peak for a CPU


def test_the_attention_command_times_causal_sdpa(tmp_path: Path) -> None:
    result = primus("benchmark", "attention", "--shape", "1x4x2x32x8", "--dtype", "fp32",
                    "--repeats", "2", "--json", str(tmp_path / "a.json"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    [op] = json.loads((tmp_path / "a.json").read_text())["ops"]
    assert op["flops"] == 2 * 4 * 32 * 32 * 8 and op["tflops"] > 0


@pytest.mark.parametrize(
    ("option", "name", "said"),
    [("--json", "dir", "cannot write {}/dir: it is a folder"),
     ("--plot", "dir", "cannot write {}/dir: it is a folder"),
     ("--plot", "rates.txt", "rates.txt: not a picture format")],
)  # fmt: skip
def test_a_report_it_cannot_write_is_refused_before_the_timing(
    tmp_path: Path, option: str, name: str, said: str
) -> None:
    (tmp_path / "dir").mkdir()
    result = primus("benchmark", "gemm", "--shape", "16x16x16", "--repeats", "1", option,
                    str(tmp_path / name), COLUMNS="400")  # fmt: skip
    unboxed = " ".join(re.sub("[│╭╮╰╯─]", " ", result.stderr).split())  # typer's usage box
    assert result.returncode == 2 and said.format(tmp_path) in unboxed, result.stderr
    assert "Traceback" not in result.stderr and "16x16x16" not in result.stdout


def test_a_shape_the_device_cannot_hold_is_refused_before_any_allocation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three 100000 x 100000 bf16 matrices (56 GiB) on this process's device, in process, with
    1 GiB free (whatever this machine has): a usage error instead of an allocation that fails
    or swaps for minutes."""
    monkeypatch.setattr(benchmark, "free_bytes", lambda torch, cuda: 1 << 30)
    huge = parse_shape("100000x100000x100000")
    said = r"^100000x100000x100000: its bf16 tensors need 55\.9 GiB, and \S+ has 1\.0 GiB free"
    with pytest.raises(ConfigError, match=said) as refused:
        run_ops([huge], "bf16", repeats=1, warmup=0)
    assert refused.value.hint == "time a smaller shape"
    check_fits([huge], "bf16", 2, "cpu", free=None)  # memory unknown: no check
    small = Gemm("qkv", 16, 16, 16)
    with pytest.raises(ConfigError, match=r"^qkv \(16x16x16\): its fp32 tensors need 0\.3 GiB"):
        check_fits([small], "fp32", 4, "NVIDIA H200", free=1 << 20)  # the L2 flush counted


def test_a_message_a_rank_cannot_hold_is_refused_before_any_allocation() -> None:
    """`collectives --size 1000g` failed in the allocation (exit 1) with training's hint."""
    check_messages_fit({"big": 1 << 40}, 2, "cpu", free=None)  # memory unknown: no check
    said = r"^big: a message of 1024\.0 GiB needs 1536\.0 GiB a rank, and cpu has 1\.0 GiB free"
    with pytest.raises(ConfigError, match=said) as refused:
        check_messages_fit({"4m": 4 << 20, "big": 1 << 40}, 2, "cpu", free=1 << 30)
    assert refused.value.hint == "time a smaller --size"


@pytest.mark.parametrize("command", ["gemm", "attention", "collectives"])
def test_gpus_that_the_jobs_layout_cannot_fill_are_refused(command: str, tmp_path: Path) -> None:
    """In process: `--gpus 3` for a global batch of 8 in micro batches of 4 timed a job that
    `projection` and `train` refuse."""
    from primus.testing.fuzz_runs import run_in_process

    recipe = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
    argv = ["benchmark", command, "-c", str(recipe), "--gpus", "3", "--repeats", "1"]
    done = run_in_process(argv, tmp_path, {})
    assert done.code == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cannot be split into micro-batches of 4 (micro_batch_size) over 3" in done.message


def test_modules_the_backend_hides_are_back_for_the_timings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: MaxText hides torch (`unused_modules`) while its job is built; `benchmark
    gemm -c` on a MaxText experiment then failed importing torch, with a traceback."""
    import sys

    from primus.backends.megatron.megatron_adapter import MegatronAdapter
    from primus.core.runtime import resolution
    from primus.testing.fuzz_runs import run_in_process

    hidden = "primus_hidden_by_the_backend"
    monkeypatch.setattr(MegatronAdapter, "unused_modules", (hidden,))
    # hiding as a backend's own process does (the test session's conftest hides nothing)
    monkeypatch.setattr(resolution, "hide_modules", lambda names: sys.modules.update(
        dict.fromkeys(names)))  # fmt: skip
    recipe = Path(__file__).resolve().parents[3] / "configs" / "megatron" / "tiny-cpu.yaml"
    argv = ["benchmark", "gemm", "-c", str(recipe), "--repeats", "1", "--warmup", "0"]
    try:
        done = run_in_process(argv, tmp_path, {})
        assert (done.code, hidden in sys.modules) == (0, False), done.stderr
    finally:
        sys.modules.pop(hidden, None)


def test_a_message_named_twice_is_refused(tmp_path: Path) -> None:
    """In process: the first `--size x=...` was dropped without a word."""
    from primus.testing.fuzz_runs import run_in_process

    argv = ["benchmark", "collectives", "--size", "x=4m", "--size", "x=8m"]
    done = run_in_process(argv, tmp_path, {})
    assert (done.code, done.stderr.splitlines()[0]) == (
        2, "error: --size x=8m: message 'x' is given twice"
    )  # fmt: skip


def test_the_command_needs_something_to_time() -> None:
    result = primus("benchmark", "gemm")
    assert result.returncode == 2 and "nothing to time" in result.stderr


@pytest.mark.parametrize(
    ("dtype", "said"),
    [("fp32", "--save-peak keeps a bf16 or fp16 rate"), ("bf16", "--save-peak needs a GPU")],
)
def test_a_peak_is_saved_only_for_a_gpus_half_precision_rate(
    tmp_path: Path, dtype: str, said: str
) -> None:
    result = primus("benchmark", "gemm", "--shape", "1024x1024x1024", "--dtype", dtype,
                    "--repeats", "100000", "--save-peak",
                    PRIMUS_PEAKS=str(tmp_path / "peaks.json"))  # fmt: skip
    # refused before the timing, which would take minutes
    assert result.returncode == 2 and said in result.stderr
    assert not (tmp_path / "peaks.json").exists()


@pytest.mark.parametrize(
    ("text", "nbytes"), [("64MiB", 64 << 20), ("4m", 4 << 20), ("1GiB", 1 << 30), ("65536", 65536)]
)
def test_sizes_read_with_their_units(text: str, nbytes: int) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["", "0", "12 parsecs", "6"])
def test_a_size_that_is_no_whole_float32_tensor_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--size"):
        parse_size(text)


def test_the_jobs_messages_are_a_layers_activations_and_a_gpus_gradients() -> None:
    job = Job(MODEL, micro_batch=2, seq_len=6, tp=2)
    sizes = job_collective_sizes(job)
    assert sizes["tp_activations"] == 12 * 8 * 2  # tokens x hidden x bf16
    assert sizes["dp_gradients"] == project(job).parameters_per_gpu * 4
    assert (bus_factor("all_reduce", 4), bus_factor("all_gather", 4)) == (1.5, 0.75)


@pytest.mark.slow
def test_collectives_over_two_ranks_report_bus_bandwidth(tmp_path: Path) -> None:
    """The JSON to /dev/stdout, a pipe here: the launcher passed its workers the resolved path
    (/proc/PID/fd/pipe:[N]), which they could not open."""
    result = primus("benchmark", "collectives", "--nproc-per-node", "2", "--size", "256KiB",
                    "--size", "grads=64k", "--repeats", "2", "--json", "/dev/stdout", "--plot",
                    str(tmp_path / "c.png"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "c.png").read_bytes().startswith(PNG)
    record = json.loads(result.stdout[result.stdout.index("\n{") :])
    assert record["ranks"] == 2
    assert [(r["message"], r["op"], r["bytes"]) for r in record["rows"]] == [
        (message, op, nbytes)
        for message, nbytes in (("256KiB", 256 << 10), ("grads", 64 << 10))
        for op in ("all_reduce", "all_gather", "reduce_scatter")
    ]
    for row in record["rows"]:
        assert row["busbw_gbs"] == pytest.approx(row["algbw_gbs"] * bus_factor(row["op"], 2))
    assert "busbw GB/s" in result.stdout


def test_a_plot_without_matplotlib_says_what_to_install(tmp_path: Path) -> None:
    """matplotlib shadowed by a package whose import fails, as where it is not installed."""
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('not here')\n")
    result = primus("benchmark", "gemm", "--shape", "8x8x8", "--dtype", "fp32", "--repeats",
                    "1", "--plot", str(tmp_path / "g.png"), PYTHONPATH=str(tmp_path))  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert "--plot needs matplotlib" in result.stderr
    assert "pip install 'primus-core[plots]'" in result.stderr
