"""The field-trial commands, run by ``split-trial`` and, through the ``splitedge.device_commands``
entry points, by ``split-device report`` and ``split-device plan --out``: the board runtime never
imports this package (its plots need matplotlib, which a board does not install)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from calibration import Calibration, CalibrationError, load_all
from fieldtrial.plots import plot_table
from fieldtrial.report import format_summary, write_report
from splitedge import SplitEdgeError

__all__ = ["main", "plot_plan", "report"]

EXAMPLES = """\
examples:
  split-trial report run.jsonl --out report/                 # latency, link rate and drops over time, CDFs, gains
  split-trial report run.jsonl --out report/ --calibration bundle/calibration.json
  split-trial plan bundle/calibration.json --out plan/       # the split table as plan.png and plan.json
"""


def report(trace: str, out: str, calibration: str | None = None) -> str:
    """Write a trace's plots and ``summary.json`` into ``out``; return the summary as text."""
    tables = load_all(calibration) if calibration else None  # None: the report takes the run's table
    summary = write_report(trace, out, tables)
    return f"{format_summary(summary)}\nwrote {out}"


def plot_plan(calibration: Calibration, out: str) -> str:
    """``plan.png`` (DSC Fig. 2 style) and ``plan.json`` of one calibration table in ``out``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    plot_table(calibration, folder / "plan.png")
    (folder / "plan.json").write_text(json.dumps(calibration.table.to_dict(), indent=2))
    return f"wrote {folder / 'plan.png'} and {folder / 'plan.json'}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="split-trial", description="Reports and plots of field trials.",
                                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    rep = commands.add_parser("report", help="plots and a summary from a split-device run --trace file",
                              epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    rep.add_argument("trace", help="JSONL trace written by split-device run --trace")
    rep.add_argument("--out", required=True, metavar="DIR", help="directory for the PNGs and summary.json")
    rep.add_argument("--calibration", metavar="FILE",
                     help="calibration.json for the gain over static splits (default: the one the run used)")
    plan = commands.add_parser("plan", help="plot a calibration.json's latest split table",
                               epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("calibration", help="calibration.json written by split-device calibrate")
    plan.add_argument("--out", required=True, metavar="DIR", help="directory for plan.png and plan.json")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "report":
            print(report(args.trace, args.out, args.calibration))
        else:
            print(plot_plan(load_all(args.calibration).latest(), args.out))
    except (SplitEdgeError, CalibrationError) as exc:
        print(f"split-trial: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
