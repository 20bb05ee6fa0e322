"""``python -m testbed COMMAND``: the testbed's commands (as root). ``replay``: a trace's link, run again
(:mod:`testbed._replay`). The board in a box has its own: ``python -m testbed.board_box``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from splitedge.lifecycle import exit_on_signals
from testbed import _replay as replay


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed", description=__doc__.split("\n\n")[0],
                                     epilog=replay.EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    replay.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """A bad trace or setting is one line and status 2; SIGINT or SIGTERM unwind the replay (its board
    killed, its link and host taken down) and end it with one line and status 130 or 143."""
    args = build_parser().parse_args(argv)

    def command() -> int:
        print(replay.main(args))
        return 0

    return exit_on_signals("testbed", command)


if __name__ == "__main__":
    sys.exit(main())
