"""The field-trial commands, run by ``split-trial`` and, through the ``splitedge.device_commands``
entry points, by ``split-device report`` and ``split-device plan --out``: the board runtime never
imports this package (its plots need matplotlib, which a board does not install)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from calibration.calibration_file import Calibration, load_all
from fieldtrial._compare import format_comparison, write_comparison
from fieldtrial._page import PAGE
from fieldtrial._plots import plot_table
from fieldtrial._report import format_summary
from splitedge.lifecycle import exit_on_signals
from splitedge.reading import add_report_arguments

__all__ = ["main", "plot_plan", "report"]

EXAMPLES = """\
examples:
  split-trial report run.jsonl --out report/                 # latency, link rate and drops over time, CDFs, gains
  split-trial report run.jsonl --out report/ --calibration bundle/calibration.json
  split-trial report a.jsonl b.jsonl --out compare/          # runs side by side: report.html, PNGs, summary.json
  split-trial report trial.jsonl replay/ --label field --label replay --out compare/
  split-trial plan bundle/calibration.json --out plan/       # the split table as plan.png and plan.json
"""


def report(
    traces: Sequence[str], out: str, calibrations: Sequence[str] | None = None, labels: Sequence[str] | None = None,
) -> str:
    """Write the report of one trace, or the comparison of several (files or folders of traces),
    into ``out`` with ``report.html``; return its summary as text. ``calibrations``: files of the
    runs' bundles (each run takes its bundle's, else the one it recorded); ``labels``: one per run."""
    given = [load_all(path) for path in calibrations or ()]
    summary = write_comparison(traces, out, given, labels or ())
    text = format_comparison(summary) if "runs" in summary else format_summary(summary)
    return f"{text}\nwrote {Path(out) / PAGE}"


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
    rep = commands.add_parser("report", help="plots, a summary and report.html from split-device run --trace files; "
                              "several runs side by side", epilog=EXAMPLES,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    add_report_arguments(rep)  # split-device report's too: one definition
    plan = commands.add_parser("plan", help="plot a calibration.json's latest split table",
                               epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    plan.add_argument("calibration", help="calibration.json written by split-device calibrate")
    plan.add_argument("--out", required=True, metavar="DIR", help="directory for plan.png and plan.json")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """A bad trace or file is one line and status 2; SIGINT or SIGTERM end it in one line (130, 143),
    as ``split-device`` does."""
    args = build_parser().parse_args(argv)

    def command() -> int:
        if args.command == "report":
            print(report(args.traces, args.out, args.calibration, args.label))
        else:
            print(plot_plan(load_all(args.calibration).latest(), args.out))
        return 0

    return exit_on_signals("split-trial", command)


if __name__ == "__main__":
    sys.exit(main())
