"""The board's settings: files, then environment, then flags (later wins), and where each came from.

::

    /etc/splitedge/device.toml            the board's (written by a deploy)
    ~/.config/splitedge/device.toml       the user's ($XDG_CONFIG_HOME)
    SPLITEDGE_HOST, SPLITEDGE_KEY_FILE…   the environment (a systemd unit's Environment=)
    --host, --key-file…                   the command line

A file holds flat keys named like the flags (``key_file = "/etc/splitedge/host.key"``); each
value is checked as the flag's own value is (the same argparse type and choices), so a file
cannot say what a flag may not. An unknown key or a wrong type is one line naming the file,
the key and what is expected. ``SPLITEDGE_CONFIG_DIRS`` (directories, ``:``-separated, lowest
precedence first) replaces the two directories: tests and unusual boards never touch /etc.

Files are TOML, read with ``tomllib`` (Python 3.11, the board's Bookworm) or ``tomli`` where
installed on 3.10.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from device_runtime.board.run_settings import KEYS, Key, SettingError
from splitedge import shown, write_atomically
from splitedge.errors import ConfigError
from splitedge.reading import read_bounded, read_text_bounded

__all__ = ["FILENAME", "KEYS", "Setting", "Settings", "apply_settings", "config_files", "load_settings",
           "run_checker", "write_settings"]

FILENAME = "device.toml"
#: A settings file is a dozen keys; one past 1 MiB is not one, and is refused unread rather than read
#: whole (a link to /dev/zero never ends, a FIFO never answers: neither is read).
MAX_FILE_BYTES = 2**20
_TYPE_WORDS = {str: "a string", int: "an integer", float: "a number", (int, float): "a number",
               (str, int): "a string or an integer"}


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str  # a file's path, "env SPLITEDGE_HOST", "flag --host" or "default"


def config_files(environ: Mapping[str, str] | None = None) -> list[Path]:
    """The files read, lowest precedence first (whether they exist or not)."""
    env = os.environ if environ is None else environ
    if env.get("SPLITEDGE_CONFIG_DIRS"):
        dirs = [Path(d) for d in env["SPLITEDGE_CONFIG_DIRS"].split(os.pathsep) if d]
    else:
        home = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
        dirs = [Path("/etc/splitedge"), Path(home) / "splitedge"]
    return [d / FILENAME for d in dirs]


def _toml_reader():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ConfigError("reading device.toml needs Python 3.11 (tomllib) or, on 3.10, pip install tomli") from None
    return tomllib


def _toml(path: Path) -> dict[str, Any]:
    tomllib = _toml_reader()
    try:
        return tomllib.loads(read_text_bounded(path, MAX_FILE_BYTES))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): correct it, or rewrite the file without it "
                          f"with split-device config --file {path} --set KEY=VALUE") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc}): correct that line, or rewrite the file without it "
                          f"with split-device config --file {path} --set KEY=VALUE") from exc
    except RecursionError:
        raise ConfigError(f"{path}: nested too deep to be a settings file: correct it, or rewrite it with "
                          f"split-device config --file {path} --set KEY=VALUE") from None
    except OSError as exc:  # splitedge.reading.NotReadable too: not a regular file, or longer than MAX_FILE_BYTES
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from exc


def _salvage(path: Path) -> tuple[dict[str, Any], list[int]]:
    """The keys of a broken file that still read line by line, and the numbers of the lines that
    do not: what ``--set`` keeps when it rewrites a file no reader can load whole."""
    tomllib = _toml_reader()
    kept: dict[str, Any] = {}
    dropped = []
    try:
        data = read_bounded(path, MAX_FILE_BYTES)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read ({exc.strerror or exc}): remove it, then split-device config "
                          f"--file {path} --set KEY=VALUE writes a new one") from exc
    for number, raw in enumerate(data.splitlines(), 1):
        try:
            line = raw.decode("utf-8")  # a line that is not UTF-8 is dropped, not kept with U+FFFD in it
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            kept.update(tomllib.loads(line))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
            dropped.append(number)
    return {k: v for k, v in kept.items() if k in KEYS}, dropped


Check = Callable[[str, Any, str], Any]  # (key, value, where) -> the value as the flag would have it


class Settings:
    """Every key's value in force and its source, before the command line (see :func:`apply_settings`)."""

    def __init__(self, values: dict[str, Setting], files_read: list[Path], files_absent: list[Path]) -> None:
        self.values = values
        self.files_read = files_read
        self.files_absent = files_absent


def _kind_ok(key: Key, value: Any) -> bool:
    kinds = key.kind if isinstance(key.kind, tuple) else (key.kind,)
    return isinstance(value, kinds) and not isinstance(value, bool)


def _check_file_value(key: Key, value: Any, where: str, check: Check) -> Any:
    if key.many:
        items = value if isinstance(value, list) else [value]
        if not all(_kind_ok(key, v) for v in items):
            raise ConfigError(
                f"{where}: {key.dest}: expected {_TYPE_WORDS[key.kind]} or a list of them, got {shown(value)}"
            )
        return [check(key.dest, str(v), where) for v in items]
    if not _kind_ok(key, value):
        raise ConfigError(f"{where}: {key.dest}: expected {_TYPE_WORDS[key.kind]}, got {shown(value)}")
    return check(key.dest, str(value), where)


def _key(name: str, path: Path) -> Key:
    key = KEYS.get(name)
    if key is None:
        near = difflib.get_close_matches(name, KEYS, n=1)
        hint = f" (did you mean {near[0]}?)" if near else f"; keys: {', '.join(KEYS)}"
        raise ConfigError(f"{path}: unknown key {name!r}{hint}")
    return key


def load_settings(check: Check, environ: Mapping[str, str] | None = None,
                  files: Sequence[Path] | None = None) -> Settings:
    """Read the files then the environment; ``check`` turns a key's text into the flag's value or
    raises :class:`ConfigError` (see :func:`run_checker`)."""
    env = os.environ if environ is None else environ
    values: dict[str, Setting] = {}
    read, absent = [], []
    for path in config_files(env) if files is None else files:
        if not path.is_file():
            absent.append(path)
            continue
        data = _toml(path)
        read.append(path)
        for name, value in data.items():
            key = _key(name, path)
            values[name] = Setting(_check_file_value(key, value, str(path), check), str(path))
    for key in KEYS.values():
        text = env.get(key.env)
        if text is None or text == "":
            continue
        where = f"environment variable {key.env}"
        if key.many:
            value = [check(key.dest, part.strip(), where) for part in text.split(",") if part.strip()]
        else:
            value = check(key.dest, text, where)
        values[key.dest] = Setting(value, f"env {key.env}")
    return Settings(values, read, absent)


def run_checker() -> Check:
    """The :data:`Check` of every key: its :data:`KEYS` entry's, the same one its flag's argparse
    ``type`` applies, so a file cannot say what a flag may not."""

    def check(dest: str, text: str, where: str) -> Any:
        key = KEYS[dest]
        try:
            return key.check(text)
        except SettingError as exc:
            raise ConfigError(f"{where}: {dest}: {exc} (as {key.flag} takes it)") from None

    return check


def _given(parser_factory: Callable[[], argparse.ArgumentParser], argv: Sequence[str]) -> set[str]:
    """The dests the command line set itself: ``argv`` parsed again with every default suppressed."""
    parser = parser_factory()
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
            elif action.dest != "help":
                action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def apply_settings(
    args: argparse.Namespace, argv: Sequence[str], parser_factory: Callable[[], argparse.ArgumentParser],
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Set on ``args`` every setting of the files and the environment that its command takes and its
    command line did not give; returns them all with their sources (flags included)."""
    settings = load_settings(run_checker(), environ)
    given = _given(parser_factory, argv)
    for name, setting in settings.values.items():
        key = KEYS[name]
        if args.command not in key.commands or not hasattr(args, key.dest):
            continue
        if key.dest in given:
            settings.values[name] = Setting(getattr(args, key.dest), f"flag {key.flag}")
        else:
            setattr(args, key.dest, setting.value)
    return settings


def describe(settings: Settings, defaults: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """(key, value, source) for every key: the setting where one is in force, else the flag's default."""
    return [
        (name, settings.values[name].value, settings.values[name].source) if name in settings.values
        else (name, defaults.get(name), "default")
        for name in KEYS
    ]


def run_defaults(parser: argparse.ArgumentParser) -> dict[str, Any]:
    (subs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {a.dest: a.default for a in subs.choices["run"]._actions}


def _file_value(key: Key, text: str, check: Check, where: str) -> Any:
    """``text`` from ``--set KEY=TEXT`` as the file stores it, checked as the flag would check it."""
    if key.many:
        items = [part.strip() for part in text.split(",") if part.strip()]
        for item in items:
            check(key.dest, item, where)
        return items
    checked = check(key.dest, text, where)
    kinds = key.kind if isinstance(key.kind, tuple) else (key.kind,)
    if int in kinds and text.lstrip("-").isdigit():
        return int(text)
    if float in kinds:
        return float(text)
    if isinstance(checked, int) and not isinstance(checked, bool) and int in kinds:
        return checked  # " 4 " or 1_000 as the check read it: the file holds the number, as a reader wants it
    return text


def write_settings(path: Path, updates: Mapping[str, str | None], check: Check | None = None) -> dict[str, tuple[Any, Any]]:
    """Set (``text``) or remove (``None``) keys of the settings file at ``path``, keeping its other
    keys; the file is replaced whole (a temporary file renamed over it), so a reader never sees
    half of it. A file no reader can load is rewritten from the lines that still read (the others
    named in a warning line on stderr), so ``--set`` can always repair it. Returns
    ``{key: (before, after)}`` for the keys that changed."""
    check = run_checker() if check is None else check
    changes: dict[str, tuple[Any, Any]] = {}
    for name in updates:
        _key(name, path)
    try:
        data = _toml(path) if path.is_file() else {}
    except ConfigError as exc:
        data, dropped = _salvage(path)
        print(f"warning: {exc}; rewriting it without line(s) {', '.join(map(str, dropped)) or 'none'}",
              file=sys.stderr)
    for name, text in updates.items():
        key = _key(name, path)
        before = data.get(name)
        after = None if text is None else _file_value(key, text, check, f"--set {name}")
        if after is None:
            data.pop(name, None)
        else:
            data[name] = after
        if before != after:
            changes[name] = (before, after)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, "# splitedge board settings (split-device config --set KEY=VALUE)\n" + tomli_w.dumps(data))
    return changes
