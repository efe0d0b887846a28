"""A GPU's health as NVIDIA's management library reports it (`pip install nvidia-ml-py`):
uncorrected ECC errors since the driver loaded, the SM clock and its maximum, and the reasons
the clock is held down. Each figure is None where NVML cannot say (a CPU, ROCm, no
nvidia-ml-py, a GPU without ECC).

Test hook: PRIMUS_PREFLIGHT_ECC_RANK=R makes rank R report one uncorrected ECC error, so a
test on a machine without NVML sees the fault caught.
"""

from __future__ import annotations

import os
from typing import Any

ECC_RANK = "PRIMUS_PREFLIGHT_ECC_RANK"
FIELDS = ("ecc_errors", "sm_clock_mhz", "max_sm_clock_mhz", "clock_limits")
# what the clock-event bit mask says (NVML's nvmlClocksEventReason*), idle and settings left out
CLOCK_LIMITS = {0x4: "application clocks", 0x8: "power cap", 0x20: "thermal (software)",
                0x40: "thermal (hardware)", 0x80: "power brake", 0x100: "display clocks"}  # fmt: skip


def gpu_health(pci_bus: str | None, rank: int) -> dict[str, Any]:
    """The figures of the GPU at PCI address `pci_bus` (`0000:1b:00.0`; None: no GPU)."""
    figures: dict[str, Any] = dict.fromkeys(FIELDS)
    if pci_bus is not None:
        figures |= _nvml(pci_bus)
    if os.environ.get(ECC_RANK) == str(rank):
        figures["ecc_errors"] = 1
    return figures


def _nvml(pci_bus: str) -> dict[str, Any]:
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return {}
    figures: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return {}
    try:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus)
        sm = pynvml.NVML_CLOCK_SM
        figures["sm_clock_mhz"] = pynvml.nvmlDeviceGetClockInfo(handle, sm)
        figures["max_sm_clock_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, sm)
        mask = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        figures["clock_limits"] = ", ".join(v for k, v in CLOCK_LIMITS.items() if mask & k)
        figures["ecc_errors"] = pynvml.nvmlDeviceGetTotalEccErrors(
            handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )
    except pynvml.NVMLError:  # not supported on this GPU: the figures so far
        pass
    finally:
        pynvml.nvmlShutdown()
    return figures
