"""Every numeric flag of every command refuses NaN, the infinities, negatives, 0 where 0 is out of
range and 10^12, in one usage line naming the flag and its range, exit status 2, never a traceback.

The cases are generated from the parsers themselves (``split-host``, ``split-device`` and
``split-export``, every subcommand): a flag added tomorrow is walked too. (``split-export``'s
parser imports no torch: its commands import it when they run.) A flag whose type is a bare ``int`` or
``float``, or whose type takes a number without :class:`splitedge.Bounds` behind it, fails here
unless it is named in :data:`TEXT` with why (issue 45: ``--idle-timeout nan`` crashed in an
assertion, ``--threads 100000`` never listened). Parsing only: nothing starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from device_runtime.cli import build_parser as device_parser
from exporter.cli import build_parser as export_parser
from host_runtime.cli import build_parser as host_parser
from splitedge import bounds_of

PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "split-host": host_parser, "split-device": device_parser, "split-export": export_parser,
}

#: Flags whose type takes text that may look like a number, and why they are not numbers.
TEXT = {
    "--camera": "an OpenCV camera index is a number, but so is a video file's name; the camera says what it opened",
    "--split": "a split id, which may be any safe name",
    "--splits": "split-export's cut ids (torch.fx node names, which may be digits) or auto",
    "--chain": "split-export's cut ids, as --splits",
    "--interface": "an address or an interface's name",
    "--key-file": "a path",
    "--tls-ca": "a path",
}

PROBES = ("nan", "NaN", "inf", "-inf", "-1", "1000000000000")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _typed_options() -> Iterator[tuple[str, tuple[str, ...], argparse.Action]]:
    for cli, factory in PARSERS.items():
        for path, parser in _commands(factory()):
            for action in parser._actions:
                if action.option_strings and action.type is not None and action.type is not Path:
                    yield cli, path, action


def _takes_a_number(parse: Callable[[str], object]) -> bool:
    try:
        parse("1")
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return True


def _cases() -> Iterator[object]:
    for cli, path, action in _typed_options():
        option = max(action.option_strings, key=len)
        bounds = bounds_of(action.type)
        if bounds is None and (option in TEXT or not _takes_a_number(action.type)):
            continue
        template = getattr(action.type, "template", "{}")
        probes = list(PROBES)
        if bounds is not None and (bounds.low > 0 or (bounds.low == 0 and bounds.low_open)):
            probes.append("0")
        for probe in probes:
            yield pytest.param(cli, path, action, template.format(probe), id=f"{cli} {' '.join(path)} {option}={probe}")


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _argv(path: tuple[str, ...], action: argparse.Action, value: str, parser: argparse.ArgumentParser) -> list[str]:
    """``path``'s command with its positionals and required options filled, and ``action`` given ``value``."""
    command = parser
    for name in path:
        (subs,) = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        command = subs.choices[name]
    argv = list(path)
    for other in command._actions:
        if other is action:
            continue
        if not other.option_strings and not isinstance(other, argparse._SubParsersAction):
            argv.append("x")
        elif other.option_strings and other.required:
            argv += [other.option_strings[0], "x"]
    return [*argv, f"{max(action.option_strings, key=len)}={value}"]


def test_no_numeric_flag_is_a_bare_int_or_float() -> None:
    bare = [f"{cli} {' '.join(path)} {action.option_strings[0]}" for cli, path, action in _typed_options()
            if action.type in (int, float)]
    assert not bare, f"give these a splitedge.Bounds (as_flag_type), not int or float: {bare}"


def test_every_flag_that_takes_a_number_is_bounded_or_named_as_text() -> None:
    loose = sorted({f"{cli} {' '.join(path)} {max(action.option_strings, key=len)}"
                    for cli, path, action in _typed_options()
                    if bounds_of(action.type) is None and max(action.option_strings, key=len) not in TEXT
                    and _takes_a_number(action.type)})
    # --live [ADDRESS:]PORT checks its port itself; its probes below hold it to the same one line.
    assert all(flag.endswith("--live") for flag in loose), loose


CASES = list(_cases())


def test_the_walk_finds_the_flags_the_issue_named() -> None:
    found = {param.id.rsplit("=", 1)[0] for param in CASES}
    for flag in ("split-host serve --idle-timeout", "split-host serve --max-wait-ms", "split-host serve --metrics-port",
                 "split-host serve --threads", "split-host install-service --drain-timeout",
                 "split-device run --threads", "split-device calibrate --frame", "split-device switch --keep",
                 "split-export build --epochs", "split-export build --input-shape", "split-export analyze --seed",
                 "split-export points --mean", "split-export deploy --serial"):
        assert flag in found, sorted(found)


@pytest.mark.parametrize("cli, path, action, value", CASES)
def test_a_numeric_flag_out_of_range_is_one_usage_line(cli: str, path: tuple[str, ...], action: argparse.Action,
                                                      value: str, capsys) -> None:
    parser = PARSERS[cli]()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(_argv(path, action, value, parser))
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    errors = [line for line in err.splitlines() if "error:" in line]
    option = max(action.option_strings, key=len)
    assert len(errors) == 1 and f"argument {option}" in errors[0] and "Traceback" not in err, err
    assert errors[0] == err.strip().splitlines()[-1], err  # the usage above it, nothing after
    bounds = bounds_of(action.type)
    if bounds is not None:  # the range is said: its maximum at least
        assert _number_text(bounds.high) in errors[0], errors[0]


def _bounds(cli: str, command: str, option: str):
    (action,) = [action for c, path, action in _typed_options()
                 if (c, path) == (cli, (command,)) and option in action.option_strings]
    return bounds_of(action.type)


def test_split_export_holds_the_boards_own_bounds() -> None:
    """What deploy hands a board (``switch --keep``) and what a bundle's preprocessing asks of a
    camera frame are held to the bounds the board itself holds them to."""
    assert _bounds("split-export", "deploy", "--keep") == _bounds("split-device", "switch", "--keep")
    frame_side = _bounds("split-device", "calibrate", "--frame")
    for option in ("--resize", "--crop"):
        side = _bounds("split-export", "build", option)
        assert (side.low, side.high) == (frame_side.low, frame_side.high), option
