"""Memory projection: what one GPU of a training job holds, from the model's shape and the job's
parallel layout, without a GPU (`primus projection memory`, docs/operations.md).

A backend adapter describes the job (`BackendAdapter.training_job`): the model, the layout, the
bytes each parameter costs in weights, gradients and optimizer state, and what its kernels keep
for the backward pass. The arithmetic is here, the same for every backend:

- parameters of the most loaded pipeline stage: attention and MLP matrices split by tensor
  parallelism (experts by expert parallelism), norms whole, the embedding (and an untied output
  layer) split over the vocabulary;
- weights, gradients and optimizer state: those parameters times their bytes, divided by the
  data-parallel ranks for what the job shards over them (ZeRO stage 1: optimizer state, 2: and
  gradients, 3 or FSDP: and weights; HSDP shards over dp / `zero_replicas` ranks); with LoRA
  the model's parameters are frozen (weights only) and the adapters' train; the weights include
  a second copy of a tied embedding where the backend keeps one (`tied_copy_bytes`);
- activations a layer keeps for one micro batch, per token: the two norms' inputs and outputs
  (4 h; split by sequence parallelism), query, keys, values and the attention output, the
  MLP's gate, up and activation outputs (split by tensor parallelism), and without a
  flash kernel the attention probabilities (heads x sequence). Full recompute keeps a layer's
  input only (plus one layer's activations while it recomputes, times the backend's
  `recompute_working_set`); selective recompute drops the
  probabilities; `projections` keeps only the projections' outputs (query, keys, values, the
  attention output projection, the MLP's gate, up and down: JAX's checkpoint policies that
  save named matmuls), recomputing the norms, RoPE, the activation function and the attention
  core; `alternate_matmuls` keeps the layer's input, every second matmul's output in forward
  order (the first, third, ...; q, k and v one matmul with `fused_qkv`) and the attention's
  output with a flash kernel's fp32 log-sum-exp (PyTorch's per-op selective checkpointing
  that saves every second mm). A 1F1B pipeline's first stage holds `pp` micro batches;
- the loss's logits on the last stage: tokens x vocabulary (split by tensor parallelism) x the
  bytes the loss keeps for each; and what it holds for the output layer at its peak, vocabulary
  x hidden (split by tensor parallelism) x `loss_output_layer_bytes` (a gradient the loss
  accumulates over its chunks, the gathered weight: `output_layer`), plus
  `loss_output_layer_sharded_bytes` over the ranks that shard gradients (the reduced shard).

A CUDA graph that replays the whole forward and backward from a private memory pool (the
backend sets `graph_pool_copies` 1 for it) holds the step's activations and logits once more
(`graph_pool`): the pool cannot reuse the blocks the eager warm-up steps left in the allocator's
cache, and an eager step's activations stay cached beside it (one H200, Llama 3.2 1B, micro batch
1: 4.7 GiB reserved beside a projected 6.6; docs/operations.md).

The peak is the start of the backward: every layer's activations and the loss alive. Where the
gradients are kept between steps they are there too, and the parts add up; where the backend
frees them after each step (`gradients_kept` false) they grow only as the backward frees the
activations, so the peak holds the larger of the two: weights + optimizer state + max(activations
+ logits + output layer, gradients).

Not included: the CUDA context, the allocator's caching and fragmentation, communication
buffers and kernel workspaces.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from primus.core.errors import ConfigError

GIB = 1 << 30
RECOMPUTE = ("none", "selective", "alternate_matmuls", "projections", "full")
LSE_BYTES = 4  # a flash kernel's log-sum-exp: fp32, one per head and token


@dataclass(frozen=True)
class Model:
    """A decoder-only transformer's shape (Llama, Qwen, Mixtral families)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int  # an expert's for MoE models
    vocab: int  # as the backend pads it
    tied: bool = True
    gated: bool = True  # SwiGLU: gate and up matrices
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    experts_per_token: int = 0

    def attention_params(self) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * kv + (q + 2 * kv) * self.qkv_bias

    def mlp_params(self) -> int:
        """One MLP's (one expert's) matrices."""
        return (3 if self.gated else 2) * self.hidden * self.ffn

    def norm_params(self) -> int:
        return 2 * self.hidden + 2 * self.head_dim * self.qk_norm

    def parameters(self) -> int:
        """The whole model's parameter count."""
        mlps = self.mlp_params() * max(1, self.experts) + self.hidden * self.experts
        layer = self.attention_params() + mlps + self.norm_params()
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * layer + embeddings + self.hidden


@dataclass(frozen=True)
class Job:
    """One training job as memory sees it. Bytes are per parameter (weights, gradients,
    optimizer state: the master copy and the moments) or per activation element."""

    model: Model
    micro_batch: int
    seq_len: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    weight_bytes: float = 2
    grad_bytes: float = 4
    optimizer_bytes: float = 12
    zero: int = 0  # what the data-parallel ranks shard: 1 optimizer, 2 + gradients, 3 + weights
    # copies of the sharded state (HSDP's replicate degree): each spans dp / zero_replicas ranks
    zero_replicas: int = 1
    # LoRA: the adapters' parameters, all layers' (0: every parameter trains); the model's own
    # are frozen: weights, without gradients or optimizer state
    adapter_parameters: int = 0
    # bytes per element of a second copy of a tied embedding that the backend keeps besides the
    # one it trains, sharded like the weights (counted with them)
    tied_copy_bytes: float = 0
    activation_bytes: int = 2
    sequence_parallel: bool = False
    flash_attention: bool = True
    # the share of the device's flash-attention rate the backend's attention kernel reaches
    attention_rate_share: float = 1.0
    recompute: str = "none"
    fused_qkv: bool = False  # q, k and v from one matmul (which ones `alternate_matmuls` keeps)
    # layers' worth of activations a full recompute holds while it recomputes a layer and runs
    # its backward (the recomputed forward, the backward's gradients, their precision)
    recompute_working_set: float = 1.0
    logit_bytes: float = 6  # what the loss keeps per logit (fp32 softmax + its bf16 gradient)
    # bytes per output-layer element (vocabulary x hidden / tp) the loss holds at its peak
    # besides the logits (a gradient accumulated over its chunks, the gathered weight); last stage
    loss_output_layer_bytes: float = 0
    loss_output_layer_sharded_bytes: float = 0  # the same, divided over the gradients' shards
    # the gradients live through the forward (kept, zeroed, between steps); false: freed after
    # each step, so the peak holds the larger of activations and loss, and gradients
    gradients_kept: bool = True
    # what the performance projection also needs (`primus.core.projection.performance`)
    global_batch: int = 0  # sequences per step; 0: one micro batch per data-parallel rank
    fused_kernels: bool = False  # norms, RoPE, SwiGLU and the loss fused (turbo, a compiler)
    # passes the memory-bound kernels make over a layer's activations, against fully fused
    # ones (None: 1 with fused_kernels, else 3); a backend sets it where a profile measured it
    elementwise_passes: float | None = None
    cuda_graphs: bool = False  # the step replayed from a graph: no per-kernel launch cost
    # the activations and logits held once more by the graph's private pool (module docstring)
    graph_pool_copies: float = 0.0
    overlap_grad_reduce: bool = False  # the gradients' reduction hidden behind the backward
    host_ms_per_layer: float = 0.0  # the host's time to launch a layer's forward and backward

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def zero_ranks(self) -> int:
        """The data-parallel ranks the ZeRO stage shards over (all of them but with HSDP)."""
        return self.dp // self.zero_replicas

    def check(self) -> None:
        """A ConfigError for a layout the model cannot take."""
        m = self.model
        splits = {
            "attention heads": (m.heads, self.tp),
            "KV heads": (m.kv_heads, self.tp),
            "MLP width": (m.ffn, self.tp),
            "layers": (m.layers, self.pp),
            "sequence": (self.seq_len, self.cp),
            "experts": (m.experts, self.ep),
            "data-parallel ranks": (self.dp, self.zero_replicas),
        }
        for what, (count, parts) in splits.items():
            if count % parts or (parts > 1 and not count):
                raise ConfigError(f"{what} ({count}) do not split into {parts} equal parts")
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"recompute '{self.recompute}' is not one of {', '.join(RECOMPUTE)}")


def check_recompute(job: Job, framework: str, modes: tuple[str, ...]) -> None:
    """A ConfigError unless `job`'s recompute is one of the `modes` the backend runs (a layout
    `rank_layouts` tried that the backend's `layout_overrides` cannot express)."""
    if job.recompute not in modes:
        raise ConfigError(f"{framework} has no recompute '{job.recompute}' (it has: "
                          f"{', '.join(modes)})")  # fmt: skip


def data_parallel(gpus: int, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """The data-parallel size that fills `gpus` GPUs; a ConfigError when it does not divide."""
    model_parallel = tp * pp * cp
    if gpus % model_parallel:
        raise ConfigError(
            f"--gpus {gpus} is not a multiple of tp {tp} x pp {pp} x cp {cp} = {model_parallel}",
            hint=f"pass --gpus {model_parallel * max(1, gpus // model_parallel)}",
        )
    return gpus // model_parallel


@dataclass(frozen=True)
class Projection:
    """Bytes on the most loaded GPU (the first pipeline stage, or the last with the logits)."""

    parameters: int  # the model's
    parameters_per_gpu: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    output_layer: float = 0.0  # what the loss holds for the output layer (Job's)
    graph_pool: float = 0.0  # a CUDA graph's private pool (Job's graph_pool_copies)
    gradients_kept: bool = True  # Job's: false, the gradients do not coexist with the rest

    @property
    def total(self) -> float:
        """The peak: weights and optimizer state, and the activations and loss with the
        gradients (the larger of the two where the gradients are freed between steps), and a
        CUDA graph's pool."""
        forward = self.activations + self.logits + self.output_layer
        if self.gradients_kept:
            return self.weights + self.gradients + self.optimizer + forward + self.graph_pool
        return self.weights + self.optimizer + max(forward, self.gradients) + self.graph_pool

    def as_dict(self) -> dict[str, float]:
        parts = {k: v for k, v in asdict(self).items() if k != "gradients_kept"}
        return parts | {"total": self.total}


def _stage_parameters(job: Job, first: bool, last: bool) -> tuple[float, float]:
    """(dense, expert) parameters one GPU of a pipeline stage holds."""
    m = job.model
    layers = m.layers // job.pp
    dense = layers * ((m.attention_params() + (0 if m.experts else m.mlp_params())) / job.tp)
    dense += layers * (m.norm_params() + m.hidden * m.experts)
    embedding = m.vocab * m.hidden / job.tp
    if first:
        dense += embedding
    if last:
        dense += m.hidden + (embedding if not m.tied or not first else 0)
    experts = layers * m.mlp_params() * m.experts / job.ep
    return dense, experts


def _matmuls(job: Job) -> list[tuple[int, int, bool]]:
    """A layer's matmuls in forward order as (input width, output width, output split by tensor
    parallelism): q, k, v (or one fused qkv), the attention output projection, the MLP's gate
    and up (or up), down; an MoE layer's MLP for each expert a token goes to."""
    m = job.model
    routed = max(1, m.experts_per_token)
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    qkv = [q + 2 * kv] if job.fused_qkv else [q, kv, kv]
    up = [(m.hidden, m.ffn * routed, True)] * (2 if m.gated else 1)
    return [*((m.hidden, width, True) for width in qkv), (q, m.hidden, False), *up,
            (m.ffn, m.hidden * routed, False)]  # fmt: skip


def _matmul_outputs(job: Job) -> list[float]:
    """The widths of a layer's matmul outputs in forward order (this rank's share)."""
    hidden_split = job.tp if job.sequence_parallel else 1
    return [out / (job.tp if split else hidden_split) for _, out, split in _matmuls(job)]


def unsaved_matmul_share(job: Job) -> float:
    """The share of a layer's matmul FLOPs whose outputs `alternate_matmuls` does not keep (the
    second, fourth, ...): what its backward computes again."""
    flops = [inputs * outputs for inputs, outputs, _ in _matmuls(job)]
    return sum(flops[1::2]) / sum(flops)


def _alternate_matmuls(job: Job, tokens: float) -> float:
    """Bytes a layer keeps when only every second matmul's output (the first, third, ...) and
    the attention's are saved: those, and the layer's input."""
    m = job.model
    hidden_split = job.tp if job.sequence_parallel else 1
    attention = m.heads * (m.head_dim if job.flash_attention else m.head_dim + job.seq_len)
    kept = m.hidden / hidden_split + sum(_matmul_outputs(job)[::2]) + attention / job.tp
    lse = m.heads / job.tp * LSE_BYTES if job.flash_attention else 0
    return tokens * (kept * job.activation_bytes + lse)


def _layer_activations(job: Job, tokens: float) -> float:
    """Bytes one layer keeps for one micro batch of `tokens` tokens (this rank's share)."""
    m = job.model
    routed = max(1, m.experts_per_token)
    hidden_split = job.tp if job.sequence_parallel else 1
    if job.recompute == "alternate_matmuls":
        return _alternate_matmuls(job, tokens)
    if job.recompute == "projections":  # q, k, v and the MLP's inputs; two outputs of width h
        split = (m.heads + 2 * m.kv_heads) * m.head_dim + (2 if m.gated else 1) * m.ffn * routed
        per_token = split / job.tp + (1 + routed) * m.hidden / hidden_split
        return tokens * per_token * job.activation_bytes
    replicated = 4 * m.hidden / hidden_split
    mlp = (3 if m.gated else 2) * m.ffn * routed
    split = 2 * m.heads * m.head_dim + 2 * m.kv_heads * m.head_dim + mlp
    probabilities = (
        0 if job.flash_attention or job.recompute == "selective" else m.heads * job.seq_len
    )
    return tokens * (replicated + (split + probabilities) / job.tp) * job.activation_bytes


def project(job: Job) -> Projection:
    """The bytes the most loaded GPU of `job` holds at its peak (the start of a backward)."""
    job.check()
    m = job.model
    tokens = job.micro_batch * job.seq_len / job.cp
    expert_dp = job.zero_ranks * job.tp * job.cp / job.ep

    def shard(stage: float, experts: float, level: int) -> float:
        return stage / (job.zero_ranks if job.zero >= level else 1) + experts / (
            expert_dp if job.zero >= level else 1
        )

    adapters = job.adapter_parameters / job.pp / job.tp  # spread over the layers like them
    layers = m.layers // job.pp
    one_layer = _layer_activations(job, tokens)
    if job.recompute == "full":  # layer inputs, and one layer's activations while recomputing
        kept = layers * tokens * m.hidden * job.activation_bytes
        kept /= job.tp if job.sequence_parallel else 1
        per_micro_batch = kept + one_layer * job.recompute_working_set
    else:
        per_micro_batch = layers * one_layer
    loss_bytes = job.loss_output_layer_bytes + shard(job.loss_output_layer_sharded_bytes, 0.0, 2)
    stages = [(True, job.pp == 1)] + ([(False, True)] if job.pp > 1 else [])
    heaviest: Projection | None = None
    for first, last in stages:
        dense, experts = _stage_parameters(job, first, last)
        trained = (adapters, 0.0) if job.adapter_parameters else (dense, experts)
        copy = m.vocab * m.hidden / job.tp if first and m.tied else 0.0
        activations = per_micro_batch * (job.pp if first else 1)
        logits = tokens * m.vocab / job.tp * job.logit_bytes if last else 0.0
        candidate = Projection(
            parameters=m.parameters(),
            parameters_per_gpu=math.ceil(dense + experts + adapters),
            weights=shard(dense + adapters, experts, 3) * job.weight_bytes
            + shard(copy, 0.0, 3) * job.tied_copy_bytes,
            gradients=shard(*trained, 2) * job.grad_bytes,
            optimizer=shard(*trained, 1) * job.optimizer_bytes,
            activations=activations,
            logits=logits,
            output_layer=m.vocab * m.hidden / job.tp * loss_bytes if last else 0.0,
            graph_pool=job.graph_pool_copies * (activations + logits),
            gradients_kept=job.gradients_kept,
        )
        if heaviest is None or candidate.total > heaviest.total:
            heaviest = candidate
    assert heaviest is not None
    return heaviest
