"""The kernel benchmark's report: the issue's targets, a Markdown table per kernel, the JSON."""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from typing import Any

import torch
from common import environment, print_table
from kernel_cases import KERNELS
from kernel_harness import Row

TARGET_ELEMENTS = 16 * 2**20  # the copy-bandwidth targets hold from 16M elements
DISTRIBUTIONS = ("torch", "triton", "primus-turbo-kernels", "liger-kernel")  # versions reported


def targets(rows: list[Row]) -> list[dict[str, Any]]:
    """The issue's targets, judged on turbo's rows: at least as fast as compile everywhere;
    the kernel's fraction of copy bandwidth from 16M elements; its speedup over liger."""
    checks = []
    for row in rows:
        if row.provider != "turbo" or row.ms is None:
            continue
        kernel = KERNELS[row.kernel]
        wanted = [("speedup vs compile", row.vs_compile, 1.0)]
        if row.mode in kernel.copy_targets and math.prod(row.shape) >= TARGET_ELEMENTS:
            wanted.append(("fraction of copy BW", row.copy_fraction, kernel.copy_targets[row.mode]))
        if row.mode in kernel.liger_targets:
            wanted.append(("speedup vs liger", row.vs_liger, kernel.liger_targets[row.mode]))
        checks += [
            {"kernel": row.kernel, "case": row.case, "what": what, "value": value,
             "target": target, "met": None if value is None else value >= target}
            for what, value, target in wanted
        ]  # fmt: skip
    return checks


COLUMNS = (
    ("ms", "ms", ".4f"),
    ("GPU ms", "gpu_ms", ".4f"),
    ("GB/s", "gbps", ",.0f"),
    ("of copy BW", "copy_fraction", ".0%"),
    ("TFLOP/s", "tflops", ".1f"),
    ("x compile", "vs_compile", ".2f"),
    ("x liger", "vs_liger", ".2f"),
    ("max abs diff", "max_abs_diff", ".2e"),
    ("check", "check", "s"),
)


def print_report(rows: list[Row], checks: list[dict[str, Any]]) -> None:
    for name, kernel in KERNELS.items():
        mine = [row for row in rows if row.kernel == name]
        if not mine:
            continue
        print(f"\n### {name}\n")
        summary = {f"{row.case} {row.provider}": asdict(row) for row in mine}
        notes = [kernel.note] + [f"{r.case} {r.provider}: {r.note}" for r in mine if r.note]
        print_table(summary, COLUMNS, "\n".join(f"- {note}" for note in notes))
    print("\n### targets (turbo)\n")
    for c in checks:
        met = {True: "met", False: "NOT MET", None: "not measured"}[c["met"]]
        value = "n/a" if c["value"] is None else f"{c['value']:.2f}"
        print(f"- {met}: {c['kernel']} {c['case']}: {c['what']} {value} (target >= {c['target']})")


def json_report(
    rows: list[Row], checks: list[dict[str, Any]], device: torch.device, **fields: Any
) -> dict[str, Any]:
    """The JSON report: date, device and versions, then `fields`, the rows and the targets."""
    device_name = None if device.type == "cuda" else f"cpu ({os.cpu_count()} cores)"
    return {
        **environment(DISTRIBUTIONS, device_name),
        **fields,
        "rows": [asdict(row) for row in rows],
        "targets": checks,
    }
