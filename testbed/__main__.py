"""``python -m testbed COMMAND``: the testbed's commands (as root). ``replay``: a trace's link, run again
(:mod:`testbed.replay`). The board in a box has its own: ``python -m testbed.board_box``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from splitedge import SplitEdgeError
from testbed import replay


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.split("\n\n")[0],
                                     epilog=replay.EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    replay.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        print(replay.main(args))
    except SplitEdgeError as exc:
        print(f"testbed: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
