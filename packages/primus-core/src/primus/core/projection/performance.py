"""Performance projection: the step time and MFU of a training job, from its FLOPs, the bytes
its memory-bound kernels and collectives move, and the rates of the GPU
(`primus projection performance`, docs/operations.md).

A roofline, term by term, for one GPU of the job (the most loaded pipeline stage):

- GEMMs: the forward GEMMs of `primus benchmark gemm --config` (three times over: forward,
  the input gradient, the weight gradient; four with full recompute, and the unsaved half of
  a layer's matmuls again with `alternate_matmuls`; an MoE layer's MLP once for each expert a
  token picks) at the GEMM rate; not modelled: MoE's token exchange;
- attention: with a flash kernel, the forward's FLOPs (causal: half the score matrix) and the
  backward's 2.5 times as many at the attention rate (the forward again under selective or
  full recompute, not under `alternate_matmuls`, which keeps its output);
  without one, the score GEMMs at the GEMM rate and the score matrix's passes (scale, mask,
  softmax and their gradients, in fp32) at the memory bandwidth;
- memory-bound kernels at the memory bandwidth: per layer and token, norms, residual adds,
  rotary embedding, SwiGLU and layout copies (unfused: each op its own pass), the loss's
  logits, gradients accumulated in a wider type than the weights (each micro batch), FSDP's
  casts of each GPU's shard of wider weights for the forward's and the backward's gathers, the
  optimizer's step;
- collectives at the bus bandwidth: tensor parallelism's activations (exposed), the data
  parallel gradient reduction (exposed unless overlapped with the backward), with sharded
  weights the gathers and reduce-scatters at the model's ends (`exposed_ends`);
- a 1F1B pipeline's bubble, (pp - 1) micro batches;
- the host: an eager step launches every kernel from Python; the step takes at least the
  backend's host time per layer and micro batch (`Job.host_ms_per_layer`), none with a CUDA
  graph or a whole-step compiler.

The rates are `primus benchmark`'s measurements where given (its `--json` files), else a
table of what these GPUs sustain (not their datasheet peaks).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from itertools import product
from pathlib import Path
from typing import TYPE_CHECKING, Any

from primus.core.diagnostics.benchmark import job_attention, job_gemms
from primus.core.errors import ConfigError
from primus.core.metrics import Peak, find_peak, peak_tflops
from primus.core.projection import RECOMPUTE, Job, project, unsaved_matmul_share

if TYPE_CHECKING:
    from primus.core.runtime import PrimusRuntime

# bytes moved per element of the score matrix without a flash kernel: the scores written, scaled
# and masked, upcast to fp32 for the softmax and back, read by PV; their gradients the same way
UNFUSED_SCORE_BYTES = 56
# elements moved per layer and token by the memory-bound kernels, fused: two norms (10 h),
# two residual adds (12 h), layout copies (10 h); SwiGLU (8 ffn); RoPE (4 (q + 2 kv))
FUSED_HIDDEN, FUSED_FFN, FUSED_QKV = 32, 8, 4
UNFUSED_FACTOR = 3  # eager PyTorch ops: fp32 upcasts and one pass per op
LOSS_BYTES = {True: 8, False: 24}  # per logit: fused cross-entropy, eager log-softmax in fp32
# the GPU idles between two kernels even when the host is ahead: a layer's forward and backward
# launch about 150 kernels, each costs about 4 us more than its work
KERNEL_GAPS_MS_PER_LAYER = 0.6
OPTIMIZER_BYTES = 36  # Adam per parameter: master, gradient, two moments read and written, the
# bf16 copy written, the gradient norm's read


@dataclass(frozen=True)
class Rates:
    """What one GPU sustains: GEMM and flash-attention TFLOP/s (bf16), memory GB/s, the bus
    bandwidth of collectives within a node (GB/s, nccl-tests' convention); its memory."""

    device: str
    gemm_tflops: float
    attention_tflops: float
    memory_gbs: float
    bus_gbs: float
    memory_gib: float
    source: str = "device table"


# sustained by large bf16 GEMMs, cuDNN/flash attention (head dim 64-128), a streaming kernel
# and an 8-GPU NVLink all-reduce (the H100 and H200 figures: docs/benchmarks)
DEVICES = (
    Rates("H200", 790.0, 360.0, 3400.0, 360.0, 141.0),
    Rates("H100", 790.0, 360.0, 2400.0, 360.0, 80.0),
    Rates("MI300X", 650.0, 300.0, 3700.0, 300.0, 192.0),
)


def device_rates(device: str) -> Rates:
    """The table's rates for a GPU named like `H100` or `NVIDIA H100 80GB HBM3`."""
    for rates in DEVICES:
        if rates.device.lower() in device.lower():
            return replace(rates, device=device)
    known = ", ".join(r.device for r in DEVICES)
    raise ConfigError(f"no rates for device '{device}'", hint=f"pass --device one of {known}")


def rates_for(device: str | None, files: list[Path]) -> Rates:
    """The rates to project with: the table's for `device` (default: the device `files` were
    measured on, else H100), with what `primus benchmark ... --json` measured in `files`."""
    records = {path: _benchmark_record(path) for path in files}
    if device is None:
        device = next(iter(records.values()), {"device": "H100"})["device"]
    rates = device_rates(device)
    return measured_rates(rates, records) if records else rates


def _benchmark_record(path: Path) -> dict[str, Any]:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else f"not JSON: {e}"
        raise ConfigError(f"--measured {path}: {why}") from None
    if not isinstance(record, dict) or not isinstance(record.get("device"), str):
        raise ConfigError(f"--measured {path}: not a primus benchmark JSON (no device named)",
                          hint="pass what primus benchmark gemm|attention|collectives --json "
                          "wrote")  # fmt: skip
    if why := _bad_rows(record):
        raise ConfigError(f"--measured {path}: {why}",
                          hint="pass what primus benchmark gemm|attention|collectives --json "
                          "wrote, unedited")  # fmt: skip
    return record


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf


def _bad_rows(record: dict[str, Any]) -> str | None:
    """What makes a benchmark record's rows unusable (not a list of rows, a GEMM's rate or
    time, or an all-reduce's bus bandwidth over several ranks, that is not a positive finite
    number), or None."""
    ranks = record.get("ranks", 1)
    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
        return f"ranks is {ranks!r}, not a positive integer"
    for key, numbers in (("ops", ("tflops", "median_ms")), ("rows", ("busbw_gbs",))):
        rows = record.get(key, [])
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return f"'{key}' is not a list of benchmark rows"
        for i, row in enumerate(rows):
            op = row.get("op")
            if not isinstance(op, dict if key == "ops" else str):
                return f"{key}[{i}] names no op"
            if key == "rows" and (op != "all_reduce" or ranks < 2):
                continue  # only an all-reduce's bus bandwidth over several ranks is read
            bad = next((n for n in numbers if not _positive(row.get(n))), None)
            if bad is not None:
                return f"{key}[{i}].{bad} is {row.get(bad)!r}, not a positive number"
    return None


def measured_rates(rates: Rates, records: dict[Path, dict[str, Any]]) -> Rates:
    """`rates` with what the benchmark `records` (by file) measured on the same device: the
    GEMMs' time-weighted rate, the attention's, the best all-reduce bus bandwidth."""
    found: dict[str, tuple[float, float]] = {}
    for path, record in records.items():
        device, ops, rows = record["device"], record.get("ops", []), record.get("rows", [])
        if (
            rates.device.lower() not in device.lower()
            and device.lower() not in rates.device.lower()
        ):
            raise ConfigError(
                f"--measured {path} was measured on '{device}', not on '{rates.device}'",
                hint=f"pass --device '{device}' or measure on the device you project for",
            )
        for row in ops:
            kind = "attention_tflops" if "heads" in row["op"] else "gemm_tflops"
            flops, ms = found.get(kind, (0.0, 0.0))
            found[kind] = (flops + row["tflops"] * row["median_ms"], ms + row["median_ms"])
        if rows and record.get("ranks", 1) < 2:
            raise ConfigError(
                f"--measured {path}: collectives over one rank say nothing of the bus",
                hint="measure them over the job's GPUs (--nproc-per-node)",
            )
        buses = [row["busbw_gbs"] for row in rows if row["op"] == "all_reduce"]
        if buses:
            found["bus_gbs"] = (max(buses), 1.0)
        if not (ops or buses):
            raise ConfigError(f"--measured {path}: no benchmark rows in it")
    values = {kind: total / weight for kind, (total, weight) in found.items()}
    names = ", ".join(sorted(values))
    source = f"measured ({names}); the rest from the device table"
    return Rates(**(asdict(rates) | values | {"source": source}))


@dataclass(frozen=True)
class StepTime:
    """One step's projected milliseconds by term, and the step itself."""

    gemm: float
    attention: float
    memory_bound: float
    optimizer: float
    tensor_parallel: float
    data_parallel: float
    kernel_gaps: float
    pipeline_bubble: float
    host_floor: float  # the host's time when it, not the GPU, bounds the step
    step: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float  # forward + backward model FLOPs per second (causal halved)
    mfu: float | None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def micro_batches(job: Job) -> int:
    """Micro batches each data-parallel rank runs per step."""
    per_rank = job.micro_batch * job.dp
    if job.global_batch and job.global_batch % per_rank:
        raise ConfigError(
            f"the global batch ({job.global_batch}) is not a multiple of micro batch "
            f"{job.micro_batch} x data parallel {job.dp}"
        )
    return max(1, job.global_batch // per_rank)


def exposed_ends(job: Job) -> float:
    """Bus bytes a micro batch of sharded weights (ZeRO 3, FSDP) waits for, per GPU: no compute
    hides the gathers and reduce-scatters at the model's ends: the embedding's and the first
    layer's gathers before the forward, the output layer's (a chunked loss runs it outside the
    layers' prefetching) and the last layer's as the backward starts, the reduce-scatters of
    their gradients. Profiles of FSDP over 4 H200s showed these exposed and the other layers'
    collectives hidden (docs/operations.md)."""
    m = job.model
    embeddings = m.vocab * m.hidden * (1 if m.tied else 2)
    layer = (m.parameters() - embeddings - m.hidden) / m.layers
    ends = (embeddings + 2 * layer) / job.tp
    return ends * (job.activation_bytes + job.grad_bytes) * (job.zero_ranks - 1) / job.zero_ranks


def _ms(amount: float, rate_per_s: float) -> float:
    return amount / rate_per_s * 1e3


def project_step(job: Job, rates: Rates, peak: float | None = None) -> StepTime:
    """The projected step of `job` on a GPU with `rates`; MFU against `peak` (TFLOP/s;
    default: the device table's dense bf16 peak)."""
    m, memory = job.model, project(job)
    count = micro_batches(job)
    layers = m.layers // job.pp
    tokens = job.micro_batch * job.seq_len / job.cp
    gemms = job_gemms(job)
    routed = max(1, m.experts_per_token)  # an MoE token runs the MLP of each expert it picks
    layer_flops = sum(g.flops * (routed if g.name.startswith("mlp") else 1) for g in gemms
                      if g.name != "logits")  # fmt: skip
    logits_flops = next(g.flops for g in gemms if g.name == "logits")
    gemm_flops = 3 * (layers * layer_flops + logits_flops) * count  # the last stage's
    model_flops = 3 * (layers * layer_flops + logits_flops / job.pp) * count  # a GPU's share

    attention = job_attention(job)
    attention_model_flops: float
    if job.flash_attention:
        rate = rates.attention_tflops * job.attention_rate_share
        attention_ms = _ms(3.5 * attention.flops * layers * count, rate * 1e12)
        attention_model_flops = 3 * attention.flops * layers * count
    else:  # QK^T and PV over the whole matrix as GEMMs, the passes over it at memory speed
        scores = attention.batch * attention.heads * attention.seq**2
        score_gemms = 3 * 2 * attention.flops * layers * count
        attention_ms = _ms(score_gemms, rates.gemm_tflops * 1e12) + _ms(
            UNFUSED_SCORE_BYTES * scores * layers * count, rates.memory_gbs * 1e9
        )
        attention_model_flops = score_gemms / 2
    forwards = 2 if job.recompute == "full" else 1  # full recompute runs each forward twice
    # alternate_matmuls: the unsaved matmuls and every element-wise op again, not the attention
    again = unsaved_matmul_share(job) if job.recompute == "alternate_matmuls" else 0.0
    gemm_ms = _ms(
        gemm_flops * (2 + forwards) / 3 + again * layers * layer_flops * count,
        rates.gemm_tflops * 1e12,
    )
    saved_attention = job.recompute in ("none", "alternate_matmuls")
    attention_ms *= (2.5 + (1 if saved_attention else 2)) / 3.5  # selective: its forward again

    q_kv = (m.heads + 2 * m.kv_heads) * m.head_dim / job.tp
    split = job.tp if job.sequence_parallel else 1
    elements = (
        FUSED_HIDDEN * m.hidden / split + (FUSED_FFN * m.ffn * routed + FUSED_QKV * q_kv) / job.tp
    )
    elements *= job.elementwise_passes or (1 if job.fused_kernels else UNFUSED_FACTOR)
    streamed = tokens * layers * elements * job.activation_bytes
    streamed += tokens * m.vocab / job.tp * LOSS_BYTES[job.fused_kernels]
    if job.grad_bytes > job.weight_bytes:  # each micro batch adds its gradients into them
        streamed += memory.parameters_per_gpu * (job.weight_bytes + 2 * job.grad_bytes)
    streamed *= (4 if job.recompute in ("full", "alternate_matmuls") else 3) / 3  # ops again
    cast = job.weight_bytes + job.activation_bytes
    if job.zero >= 3 and job.weight_bytes > job.activation_bytes:  # cast for forward and backward
        streamed += 2 * memory.parameters_per_gpu / job.zero_ranks * cast
    memory_ms = _ms(streamed * count, rates.memory_gbs * 1e9)
    sharded = memory.parameters_per_gpu / (job.zero_ranks if job.zero >= 1 else 1)
    optimizer_ms = _ms(sharded * OPTIMIZER_BYTES, rates.memory_gbs * 1e9)

    bus = rates.bus_gbs * 1e9
    activations = tokens * m.hidden * job.activation_bytes
    tp_ms = (
        0.0
        if job.tp == 1
        else _ms(4 * layers * count * activations * 2 * (job.tp - 1) / job.tp, bus)
    )
    gradients = memory.parameters_per_gpu * job.grad_bytes * 2 * (job.dp - 1) / job.dp
    dp_ms = 0.0 if job.overlap_grad_reduce else _ms(gradients, bus)
    if job.zero >= 3 and job.zero_ranks > 1:  # nothing to hide them behind: see exposed_ends
        dp_ms += _ms(exposed_ends(job) * count, bus)

    gaps_ms = KERNEL_GAPS_MS_PER_LAYER * layers * count
    per_micro_batch = (gemm_ms + attention_ms + memory_ms + tp_ms + gaps_ms) / count
    bubble_ms = (job.pp - 1) * per_micro_batch
    gpu_ms = count * per_micro_batch + optimizer_ms + dp_ms + bubble_ms
    host_ms = 0.0 if job.cuda_graphs else job.host_ms_per_layer * layers * (count + job.pp - 1)
    step_ms = max(gpu_ms, host_ms)
    global_tokens = count * job.micro_batch * job.seq_len * job.dp
    tflops = (model_flops + attention_model_flops) / step_ms * 1e3 / 1e12
    peak = peak or peak_tflops(rates.device)
    return StepTime(
        gemm=gemm_ms,
        attention=attention_ms,
        memory_bound=memory_ms,
        optimizer=optimizer_ms,
        tensor_parallel=tp_ms,
        data_parallel=dp_ms,
        kernel_gaps=gaps_ms,
        pipeline_bubble=bubble_ms,
        host_floor=host_ms,
        step=step_ms,
        tokens_per_s_per_gpu=global_tokens / job.gpus / step_ms * 1e3,
        model_tflops_per_gpu=tflops,
        mfu=tflops / peak if peak else None,
    )


# a layout fits when the projection leaves this share of the GPU's memory to what it leaves
# out (the CUDA context, the allocator's cache, communication buffers, workspaces)
HEADROOM = 0.15
MICRO_BATCHES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class ProjectedRun:
    """An experiment's training job on some GPUs, the peak its MFU is taken against, its step."""

    job: Job
    peak: Peak
    step: StepTime


def project_run(runtime: PrimusRuntime, gpus: int, rates: Rates) -> ProjectedRun:
    """The step of `runtime`'s experiment on `gpus` GPUs at `rates`."""
    job = runtime.training_job(gpus)
    peak = find_peak(runtime.module.params.get("peak_tflops"), rates.device)
    return ProjectedRun(job, peak, project_step(job, rates, peak.tflops))


@dataclass(frozen=True)
class Candidate:
    """A layout of the job on the GPUs, its memory and its step."""

    job: Job
    memory_gib: float
    step: StepTime


def rank_layouts(job: Job, gpus: int, rates: Rates) -> list[Candidate]:
    """The layouts of `job` on `gpus` GPUs that fit, fastest first: tensor and pipeline
    parallel sizes (powers of two), micro batches that divide the global batch, each recompute
    choice; sequence parallel with tensor parallel; the rest of `job` (context and expert
    parallel, ZeRO stage, kernels) as it is."""
    from primus.core.projection import GIB

    sizes = [2**i for i in range(gpus.bit_length()) if gpus % 2**i == 0]
    global_batch = job.global_batch or job.micro_batch * job.dp
    found = []
    for tp, pp, micro_batch, recompute in product(sizes, sizes, MICRO_BATCHES, RECOMPUTE):
        if gpus % (tp * pp * job.cp) or (tp > 8):
            continue
        dp = gpus // (tp * pp * job.cp)
        if global_batch % (micro_batch * dp):
            continue
        layout = replace(job, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, recompute=recompute,
                         sequence_parallel=tp > 1, global_batch=global_batch)  # fmt: skip
        try:
            memory = project(layout).total / GIB
        except ConfigError:  # the model does not split this way
            continue
        if memory <= rates.memory_gib * (1 - HEADROOM):
            found.append(Candidate(layout, memory, project_step(layout, rates)))
    return sorted(found, key=lambda c: c.step.step)
