"""The slowest tests of a whole ``make test``, over its four suites (each writes a JUnit XML file).

Each suite's pytest prints its own ten slowest; this prints the ten of the whole run at its end,
each with its set-up and tear-down (a fixture that builds for a minute is that test's minute).

    python3 -m tests.slowest build/test-results/*.xml
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def slowest(paths: list[Path], count: int = 10) -> list[tuple[float, str]]:
    """The ``count`` longest test cases in the JUnit files ``paths``: (seconds, test id)."""
    cases = []
    for path in paths:
        for case in ElementTree.parse(path).iter("testcase"):
            cases.append((float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}"))
    return sorted(cases, reverse=True)[:count]


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv if Path(p).is_file()]
    if not paths:
        print("no test results to rank (did any suite run?)")
        return 0
    print("==== the ten slowest tests of the run (set-up and tear-down included) ====")
    for seconds, test in slowest(paths):
        print(f"{seconds:8.2f}s  {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
