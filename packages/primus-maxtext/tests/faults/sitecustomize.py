"""Test only: faults for MaxText runs, made for real inside the run. With this folder on
PYTHONPATH (Python imports `sitecustomize` at start-up, before Primus loads its patches), the
patch `maxtext.test_faults` is registered next to the backend's own:

- PRIMUS_TEST_NONFINITE="3=nan,7=inf,8=inf" (Primus's step numbers): the train loss of those
  steps is multiplied by NaN or Inf inside the jitted train step, so the loss and the gradients
  of those steps are non-finite.
- PRIMUS_TEST_STEP_SECONDS=0.3: each training step takes that much longer (a sleep after it),
  so that a signal sent once a step is logged lands while the run still has steps to go.
- PRIMUS_TEST_SAMPLES=FOLDER: each process appends, per batch it loads, one JSON line to
  FOLDER/rank-<r>.jsonl: a hash of each of its rows (the samples it trains on).

and, for the LoRA tests, the patch `test.frozen_weights`:

- PRIMUS_TEST_FROZEN=OUT.npz: the model's frozen weights after training (every parameter but
  the LoRA adapters, as the trained model holds them; what MaxText's train_loop returns) saved
  with numpy, by path (`decoder/layers/mlp/wo/kernel`).
"""

import os

FAULT = os.environ.get("PRIMUS_TEST_NONFINITE")
PAUSE = float(os.environ.get("PRIMUS_TEST_STEP_SECONDS") or 0)
SAMPLES = os.environ.get("PRIMUS_TEST_SAMPLES")
FROZEN = os.environ.get("PRIMUS_TEST_FROZEN")

if FROZEN:
    from primus.core.patches import PatchContext, register_patch

    @register_patch("test.frozen_weights", backend="maxtext", phase="before_train")
    def keep_frozen(ctx: PatchContext) -> None:
        """Test only: the frozen weights after training, saved in PRIMUS_TEST_FROZEN."""

        def keep(original):
            def train_loop(*args, **kwargs):
                state = original(*args, **kwargs)
                save_frozen(state, FROZEN)
                return state

            return train_loop

        ctx.wrap("maxtext.trainers.pre_train.train", "train_loop", keep)

    def save_frozen(state, out):
        import jax
        import numpy as np

        frozen = {}
        for path, leaf in jax.tree_util.tree_leaves_with_path(state):
            parts = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
            if parts[0] != "model" or "rngs" in parts or any("lora" in p for p in parts):
                continue
            if parts[-1] in ("value", ".value"):  # the nnx.Variable's own
                parts.pop()
            frozen["/".join(parts[1:])] = np.asarray(leaf)
        np.savez(out, **frozen)


if FAULT or PAUSE or SAMPLES:
    from primus.core.patches import PatchContext, register_patch

    TRAIN = "maxtext.trainers.pre_train.train"
    LOADER = "maxtext.common.data_loader.DataLoader"
    current: list = []  # the traced step counter of the train step being traced

    @register_patch(
        "maxtext.test_faults",
        backend="maxtext",
        phase="before_train",
        priority=40,  # inside maxtext.nonfinite's guard, which must see the fault
        target=f"{TRAIN}.train_step, {TRAIN}.loss_fn, {TRAIN}.training_loop_iteration, "
        f"{LOADER}.load_next_batch_pre_sharding",
    )
    def inject(ctx: PatchContext) -> None:
        """Test only: non-finite losses at chosen steps, slower steps, the samples logged."""
        if SAMPLES:
            ctx.wrap(LOADER, "load_next_batch_pre_sharding", logged)
        if PAUSE:
            ctx.wrap(TRAIN, "training_loop_iteration", slowed)
        if FAULT:
            ctx.wrap(TRAIN, "train_step", stepping)
            ctx.wrap(TRAIN, "loss_fn", poisoned)

    def slowed(original):
        import time

        def training_loop_iteration(*args):
            metrics = original(*args)
            time.sleep(PAUSE)
            return metrics

        return training_loop_iteration

    def stepping(original):
        import jax

        from primus.backends.maxtext.reliability.nonfinite import is_step_counter

        def train_step(model, config, sms, ps, state, data, *rng):
            paths = jax.tree_util.tree_flatten_with_path(state)[0]
            current[:] = [next(v for p, v in paths if is_step_counter(p))]
            return original(model, config, sms, ps, state, data, *rng)

        return train_step

    def poisoned(original):
        import jax.numpy as jnp

        faults = dict(item.split("=") for item in FAULT.split(","))
        steps = jnp.asarray([int(step) for step in faults])
        factors = jnp.asarray([float(kind) for kind in faults.values()])

        def loss_fn(model, config, data, dropout_rng, params, *args, is_train=True, **kw):
            loss, aux = original(model, config, data, dropout_rng, params, *args,
                                 is_train=is_train, **kw)  # fmt: skip
            if is_train and current:  # the step counter counts from 0, Primus's steps from 1
                hit = current[0].astype(jnp.int32) + 1 == steps
                loss = loss * jnp.prod(jnp.where(hit, factors, 1.0))
            return loss, aux

        return loss_fn

    def logged(original):
        import hashlib
        import json

        import jax
        import numpy as np

        def load_next_batch_pre_sharding(self):
            batch = original(self)
            inputs = batch["inputs"]  # a global array: this process's rows are its shards'
            local = np.concatenate([np.asarray(s.data) for s in inputs.addressable_shards])
            rows = [hashlib.sha1(row.tobytes()).hexdigest()[:16] for row in local]
            with open(f"{SAMPLES}/rank-{jax.process_index()}.jsonl", "a") as out:
                out.write(json.dumps(rows) + "\n")
            return batch

        return load_next_batch_pre_sharding
