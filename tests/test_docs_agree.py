"""The docs and ``--help`` say the same thing: every flag the docs name exists, every default they
state is the parser's, and every example command line parses.

``docs/protocol.md`` once gave ``--max-wait-ms`` a default of 2 after the host's had become 0.
Read from README.md and docs/*.md:

* command lines in fenced blocks (``split-device run bundle/ --camera 0``) and in ``--help``
  epilogs are parsed by their command's parser;
* a flag in a backtick span that names a command (`` `split-host serve --max-frame-mb` ``), in
  a table row whose first cell does, or under a heading that does (docs/commands.md's
  ``## `split-device run` ``, docs/cli.md's ``### split-device run``), belongs to that command
  and subcommand; any other flag in backticks must belong to one of the commands
  (split-device, split-host, split-export, split-trial; not in docs/benchmarks.md and
  docs/models.md, logs of runs whose ``bench/`` scripts have flags of their own);
* "`--flag` (default N)", "(default N, `--flag`)", "`--flag N` (default)" and "(default N)" in
  a flag's own help must equal the parser's default.

split-export needs torch: where it is not installed its parts are skipped.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from device_runtime import cli as device_cli
from fieldtrial import commands as trial_commands
from host_runtime import cli as host_cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Dated records of benchmark runs (docs/models.md: bench/zoo.py's table): flags of bench/ scripts, defaults of the day.
LOGS = {ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "models.md"}
HAS_EXPORTER = importlib.util.find_spec("torch") is not None

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
SPAN = re.compile(r"`([^`\n]+)`")
COMMAND = re.compile(r"^(split-device|split-host|split-export|split-trial)\b\s*(\S*)")
#: Programs whose command lines the docs show with their own flags (``python3 -m venv
#: --system-site-packages``, ``debootstrap --arch=arm64``): not ours to check.
FOREIGN = {
    "apt", "apt-get", "debootstrap", "env", "flock", "git", "ip", "make", "pip", "pip3", "python", "python3",
    "rsync", "ssh", "systemctl", "systemd-analyze", "tc",
}


def parsers() -> dict[str, argparse.ArgumentParser]:
    found = {
        "split-device": device_cli.build_parser(), "split-host": host_cli.build_parser(),
        "split-trial": trial_commands.build_parser(),
    }
    if HAS_EXPORTER:
        from exporter import cli as export_cli

        found["split-export"] = export_cli.build_parser()
    return found


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings}


PARSERS = parsers()
#: (command, subcommand) → flag → action; "" is the command's own (--help).
ACTIONS = {
    (command, sub): flags(sub_parser)
    for command, parser in PARSERS.items()
    for sub, sub_parser in [("", parser), *subcommands(parser).items()]
}


@dataclass(frozen=True)
class Mention:
    doc: str
    line: int
    flag: str
    command: str | None  # split-device, split-host, split-export, or None where the text names none
    subs: tuple[str, ...]  # the subcommands it may be a flag of; empty: any of the command's


def mentions() -> Iterator[Mention]:
    for path in DOCS:
        fenced, section = False, (None, ())
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
                continue
            if fenced:
                yield from _in_text(path, number, line, *_command(line.strip()))
                continue
            if line.startswith("#"):
                section = _command(line.lstrip("#").strip().replace("`", ""))
            first_cell = SPAN.findall(line.split("|")[1]) if line.startswith("|") else []
            row = _command(first_cell[0]) if first_cell else section
            for span in SPAN.findall(line):
                command, subs = _command(span)
                yield from _in_text(path, number, span, *((command, subs) if command else row))


def _command(text: str) -> tuple[str | None, tuple[str, ...]]:
    """The command and the subcommands a text names (``split-device run/calibrate --key-file``)."""
    match = COMMAND.match(text.removeprefix("sudo "))
    if match is None:
        return None, ()
    command, word = match.groups()
    known = {sub for c, sub in ACTIONS if c == command and sub}
    subs = tuple(s for s in word.split("/") if s in known)
    return command, subs


def _in_text(path: Path, number: int, text: str, command: str | None, subs: tuple[str, ...]) -> Iterator[Mention]:
    if "bench/" in text:
        return  # a benchmark script's flags
    words = text.removeprefix("sudo ").split()
    if words and Path(words[0]).name in FOREIGN:
        return  # another program's command line
    for flag in FLAG.findall(text):
        yield Mention(path.name, number, flag, command, subs)


def _owners(mention: Mention) -> list[dict[str, argparse.Action]]:
    """The flag tables a mention may refer to."""
    return [
        table for (command, sub), table in ACTIONS.items()
        if (mention.command is None or command == mention.command) and (not mention.subs or sub in mention.subs)
    ]


def test_every_flag_a_doc_names_for_a_command_is_that_commands() -> None:
    wrong = [
        m for m in mentions()
        if m.command is not None and m.command in PARSERS and not any(m.flag in t for t in _owners(m))
    ]
    assert wrong == []


def test_every_other_flag_in_the_docs_is_one_of_the_commands() -> None:
    if not HAS_EXPORTER:
        pytest.skip("split-export's flags need torch (the workstation environment)")
    wrong = [
        m for m in mentions()
        if m.command is None and ROOT / "docs" / m.doc not in LOGS and not any(m.flag in t for t in _owners(m))
    ]
    assert wrong == []


STATED_DEFAULTS = (
    re.compile(r"`(?P<flag>--[a-z0-9-]+)`[^`(.]{0,30}?\(default (?P<value>[^;,)]+)"),  # `--max-queue` (default 256)
    re.compile(r"\(default (?P<value>[^;,)]+), `(?:split-[a-z]+ [a-z]+ )?(?P<flag>--[a-z0-9-]+)"),  # (default 64 MiB, `--x`)
    re.compile(r"`(?P<flag>--[a-z0-9-]+) (?P<value>[^`\s]+)` \(default\)"),  # `--split auto` (default)
)
HELP_DEFAULT = re.compile(r"\bdefault (?P<value>[\w.,-]+?)[,;:)]?(?:\s|$)")


def stated_defaults() -> Iterator[tuple[str, str, str]]:
    """(where, flag, value) for every default the docs state."""
    for path in DOCS:
        text = path.read_text()
        for pattern in STATED_DEFAULTS:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                yield f"{path.name}:{line}", match["flag"], match["value"]


def _normal(value: object) -> str:
    """A default as the docs write it: numbers without a trailing .0, lists comma-joined."""
    if isinstance(value, (tuple, list)):
        return ",".join(map(_normal, value))
    text = str(value).split()[0] if str(value).strip() else str(value)
    try:
        return f"{float(text):g}"
    except ValueError:
        return text


def test_every_default_the_docs_state_is_the_parsers() -> None:
    wrong = []
    for where, flag, value in stated_defaults():
        defaults = {_normal(t[flag].default) for t in ACTIONS.values() if flag in t}
        if defaults and _normal(value) not in defaults:
            wrong.append(f"{where}: {flag} documented as {value!r}, the parser's default is {' or '.join(defaults)}")
    assert wrong == []


def test_every_default_a_help_text_states_is_the_parsers() -> None:
    wrong = []
    for (command, sub), table in ACTIONS.items():
        for flag, action in table.items():
            for match in HELP_DEFAULT.finditer(action.help or ""):
                value = match["value"]
                numeric = re.fullmatch(r"-?[\d.]+(,[\d.]+)*", value) is not None
                if (numeric or value in (action.choices or ())) and _normal(value) != _normal(action.default):
                    wrong.append(f"{command} {sub} {flag}: help says default {value}, the parser's is {action.default!r}")
    assert wrong == []


def command_lines() -> Iterator[tuple[str, str]]:
    """(where, line) for every command line in the docs' fenced blocks and the parsers' epilogs."""
    for path in DOCS:
        fenced, pending = False, ""
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            elif fenced:
                pending += line.rstrip("\\")
                if not line.endswith("\\"):
                    yield f"{path.name}:{number}", pending.strip()
                    pending = ""
    for command, parser in PARSERS.items():
        for sub, sub_parser in [("", parser), *subcommands(parser).items()]:
            for line in (sub_parser.epilog or "").splitlines():
                yield f"{command} {sub} --help", line.strip()


def test_every_example_command_line_parses() -> None:
    wrong = []
    for where, line in command_lines():
        if line.split(" ")[0] not in PARSERS:
            continue
        words = shlex.split(line.split("#")[0].split("|")[0])
        try:
            PARSERS[words[0]].parse_args(words[1:])
        except SystemExit:
            wrong.append(f"{where}: {line}")
    assert wrong == []
