"""The test suite's time, per package and per module, from a pytest JUnit XML report.

    uv run pytest --junitxml=/tmp/junit.xml
    uv run python tools/test_budget.py /tmp/junit.xml [--modules 15]

Prints a Markdown table per package (the distribution under packages/, or tests/ for the
cross-package tests): tests, seconds summed over the workers, the share of the whole, then the
slowest modules. With `--dist loadfile` a module runs whole on one worker, so the slowest module
is also a floor under the wall time. docs/testing.md keeps the record.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path


def module_of(classname: str) -> str:
    """The test module's path for a JUnit classname (dotted path, then any test class)."""
    parts = classname.split(".")
    end = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
    return "/".join(parts[: end + 1]) + ".py"


def module_times(report: Path) -> tuple[Counter[str], Counter[str]]:
    """Seconds (setup, call and teardown) and test counts per test module, from a report."""
    seconds: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for case in ET.parse(report).iter("testcase"):
        module = module_of(case.get("classname", ""))
        seconds[module] += float(case.get("time", 0))
        counts[module] += 1
    return seconds, counts


def package_of(module: str) -> str:
    parts = module.split("/")
    return parts[1] if parts[0] == "packages" and len(parts) > 1 else parts[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="pytest's --junitxml file")
    parser.add_argument("--modules", type=int, default=15, help="how many slowest modules")
    args = parser.parse_args()
    seconds, counts = module_times(args.report)
    total = sum(seconds.values()) or 1.0
    per_package: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for module, s in seconds.items():
        per_package[package_of(module)][0] += counts[module]
        per_package[package_of(module)][1] += s
    print("| package | tests | seconds | share |\n| --- | ---: | ---: | ---: |")
    for name, (n, s) in sorted(per_package.items(), key=lambda kv: -kv[1][1]):
        print(f"| {name} | {int(n)} | {s:.0f} | {100 * s / total:.0f}% |")
    print(f"| all | {sum(counts.values())} | {total:.0f} | 100% |\n")
    print("| module | tests | seconds |\n| --- | ---: | ---: |")
    for module, s in seconds.most_common(args.modules):
        print(f"| `{module}` | {counts[module]} | {s:.0f} |")


if __name__ == "__main__":
    main()
