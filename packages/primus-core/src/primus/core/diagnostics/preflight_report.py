"""`primus preflight`'s verdict and report: every rank's figures against the job's median, the
outliers named, rendered as a console table, JSON or Markdown. Pure: no torch, no processes."""

from __future__ import annotations

import statistics
from typing import Any

# The per-rank figures where higher is better, each compared with the job's median.
COMPARED = {
    "gemm_tflops": "GEMM TFLOP/s",
    "disk_write_mbs": "disk write MB/s",
    "sm_clock_mhz": "SM clock MHz (under load)",
    "node_busbw_gbs": "all-reduce GB/s within the node",
}
COLUMNS = {  # key: header, for the table's columns in order
    "rank": "rank",
    "host": "host",
    "device": "device",
    "device_memory_gib": "dev GiB",
    "mem_available_gib": "host GiB free",
    "disk_free_gib": "disk GiB free",
    "disk_write_mbs": "write MB/s",
    "gemm_tflops": "GEMM TFLOP/s",
    "sm_clock_mhz": "SM MHz",
    "ecc_errors": "ECC errors",
    "node_busbw_gbs": "node GB/s",
}


def outliers(values: list[float], tolerance_pct: float) -> list[int]:
    """The indices of `values` more than `tolerance_pct` percent below their median."""
    if not values:
        return []
    floor = statistics.median(values) * (1 - tolerance_pct / 100)
    return [i for i, value in enumerate(values) if value < floor]


def verdict(ranks: list[dict[str, Any]], collectives: dict[str, Any], tolerance_pct: float) -> dict:
    """The whole job's report: `ranks` (one dict of figures a rank, in rank order) with the
    medians of the compared figures, the outliers (rank, host, value, median) and pass/fail.
    A figure a rank has not measured (None: disk is measured once a node) is left out."""
    medians: dict[str, float] = {}
    found = []
    for key in COMPARED:
        measured = [r for r in ranks if r.get(key) is not None]
        if not measured:
            continue
        values = [float(r[key]) for r in measured]
        medians[key] = statistics.median(values)
        for i in outliers(values, tolerance_pct):
            row = measured[i]
            below = 100 * (1 - values[i] / medians[key])
            found.append(
                {"metric": key, "rank": row["rank"], "host": row["host"], "value": values[i],
                 "median": medians[key], "below_pct": round(below, 1)}
            )  # fmt: skip
    faults = [
        {"rank": r["rank"], "host": r["host"], "ecc_errors": r["ecc_errors"]}
        for r in ranks
        if r.get("ecc_errors")
    ]
    return {
        "passed": not found and not faults,
        "world_size": len(ranks),
        "tolerance_pct": tolerance_pct,
        "medians": medians,
        "outliers": found,
        "faults": faults,
        "collectives": collectives,
        "ranks": ranks,
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _rows(report: dict) -> list[list[str]]:
    marks = {o["rank"]: " SLOW" for o in report["outliers"]}
    marks |= {f["rank"]: " FAULT" for f in report["faults"]}
    return [
        [_cell(r.get(key)) + (marks.get(r["rank"], "") if key == "rank" else "")
         for key in COLUMNS]
        for r in report["ranks"]
    ]  # fmt: skip


def _summary(report: dict) -> list[str]:
    coll = report["collectives"]
    lines = ["collectives: none (one rank)"]
    if coll.get("all_reduce_busbw_gbs") is not None:
        lines = [
            f"bus bandwidth over {report['world_size']} ranks ({coll['bytes'] >> 20} MiB): "
            f"all-reduce {_cell(coll['all_reduce_busbw_gbs'])} GB/s, all-gather "
            f"{_cell(coll['all_gather_busbw_gbs'])} GB/s"
        ]
    for o in report["outliers"]:
        lines.append(
            f"outlier: rank {o['rank']} ({o['host']}) {COMPARED[o['metric']]} {_cell(o['value'])}"
            f" is {o['below_pct']}% below the median {_cell(o['median'])}"
        )
    for f in report["faults"]:
        lines.append(
            f"fault: rank {f['rank']} ({f['host']}) has {f['ecc_errors']} uncorrected ECC "
            "errors since its driver loaded: drain its node"
        )
    for r in report["ranks"]:
        if r.get("clock_limits"):
            lines.append(f"note: rank {r['rank']} ({r['host']}) clock held by {r['clock_limits']}")
    result = "PASS" if report["passed"] else "FAIL"
    lines.append(f"preflight: {result} (tolerance {report['tolerance_pct']:g}% below the median)")
    return lines


def render_table(report: dict) -> str:
    """The console report: one row a rank, then the collectives, the outliers and the verdict."""
    rows = [list(COLUMNS.values()), *_rows(report)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    table = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return "\n".join([*table, *_summary(report)]) + "\n"


def render_markdown(report: dict) -> str:
    """The report as Markdown: the same table and lines."""
    lines = ["# Preflight", "", "| " + " | ".join(COLUMNS.values()) + " |"]
    lines.append("|" + " --- |" * len(COLUMNS))
    lines += ["| " + " | ".join(row) + " |" for row in _rows(report)]
    return "\n".join([*lines, "", *(f"- {line}" for line in _summary(report))]) + "\n"
