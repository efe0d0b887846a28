"""Out of memory: what each framework raises becomes one message naming the allocation (the
frameworks' real errors, from allocations no machine has)."""

from __future__ import annotations

import pytest

from primus.core.errors import ConfigError
from primus.core.reliability.out_of_memory import OutOfMemoryError, out_of_memory


def raised(allocate) -> BaseException:
    with pytest.raises(BaseException) as caught:
        allocate()
    return caught.value


def test_torch_and_jax_allocations_that_fail_are_one_message_with_the_size() -> None:
    import jax.numpy as jnp
    import torch

    torch_cpu = raised(lambda: torch.empty(2**50, dtype=torch.uint8))
    xla = raised(lambda: jnp.zeros(2**45).block_until_ready())
    for exc, size in ((torch_cpu, "(1048576.0 GiB)"), (xla, "(131072.0 GiB)")):
        assert out_of_memory(RuntimeError("a step failed"), 3) is None  # not about memory
        wrapped = RuntimeError("the step failed")
        wrapped.__cause__ = exc  # as a framework passes it on
        found = out_of_memory(wrapped, 3)
        assert isinstance(found, OutOfMemoryError)
        assert str(found).startswith("out of memory on rank 3: ")
        assert size in str(found).splitlines()[0]
        assert "primus projection memory" in str(found)
        assert found.report_key() == "error: out of memory"  # the ranks report it once


def test_pythons_memory_error_counts_and_config_errors_stay_theirs() -> None:
    exc = raised(lambda: bytearray(2**62))
    assert isinstance(exc, MemoryError)
    assert str(out_of_memory(exc)).startswith("out of memory: an allocation failed")  # no rank
    assert out_of_memory(ConfigError("out of memory is not this")) is None
