"""Fixtures shared by MaxText's tests: MaxText's synthetic batch of a finished run; the fork
server of one-process runs."""

from __future__ import annotations

import functools
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml

from primus.backends.maxtext.maxtext_adapter import MaxTextAdapter
from primus.testing.faults import Forks

# SyntheticDataIterator's tokens, under the PRNG implementation MaxText's trainer sets
BATCH = """import sys, jax, jax.numpy as jnp, numpy as np
rows, length, vocab = map(int, sys.argv[2:])
key = jax.random.key(0, impl="unsafe_rbg")
np.save(sys.argv[1], np.asarray(jax.random.randint(key, (rows, length + 1), 0, vocab, jnp.int32)))
"""


@functools.cache
def synthetic_tokens(run_dir: Path) -> np.ndarray:
    """The tokens (rows, length + 1) of MaxText's synthetic data in a one-device run (inputs
    are [:, :-1], targets [:, 1:]), from the run's resolved config. JAX draws them in a
    subprocess on its default backend, as the trainer did; this process keeps no JAX backend
    (on a GPU, no preallocated memory)."""
    resolved = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    keys = resolved["modules"]["pre_trainer"]["overrides"]
    shape = (keys["per_device_batch_size"], keys["max_target_length"], keys["vocab_size"])
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "tokens.npy"
        done = subprocess.run([sys.executable, "-c", BATCH, str(out), *map(str, shape)],
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return np.load(out).astype(np.int64)


@pytest.fixture(scope="session")
def synthetic_batch() -> Callable[[Path], np.ndarray]:
    """`synthetic_tokens`: the batch of a finished run's step 1 (MaxText's step 0)."""
    return synthetic_tokens


@pytest.fixture(scope="session")
def forks() -> Iterator[Forks]:
    """A process that imported MaxText once and forks each one-process run whose imports are
    not under test (`primus.testing.forked`), for every module of a pytest worker, without
    the modules a MaxText process hides. faults/ is on its path: faults/sitecustomize.py,
    imported again in a run that asks for it with its variables (test_reliability), does
    nothing without them."""
    faults = str(Path(__file__).resolve().parent / "faults")
    hidden = MaxTextAdapter.unused_modules
    train = "maxtext.trainers.pre_train.train"
    with Forks(train, env={"PYTHONPATH": faults}, hidden=hidden) as server:
        yield server
