"""docs/cli.md is what the commands' parsers say: a flag added, removed or re-helped in the code
without running ``python docs/gen_cli.py`` fails here. Runs where torch is not installed too
(building split-export's parser imports none)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli", ROOT / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_cli_md_is_what_the_parsers_generate() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == GEN.render(), "docs/cli.md differs from the parsers: run python docs/gen_cli.py"


def test_every_subcommand_and_flag_has_its_place() -> None:
    """Each subcommand has a section, and each of its flags a line in it."""
    page = (ROOT / "docs" / "cli.md").read_text()
    sections = dict(re.findall(r"^### (\S+ \S+)\n(.*?)(?=^##|\Z)", page, flags=re.M | re.S))
    for command, module, _ in GEN.COMMANDS:
        for name, _, sub in GEN.subcommands(GEN.parser_of(module)):
            section = sections[f"{command} {name}"]
            for action in GEN.arguments(sub):
                for option in action.option_strings:
                    assert f"`{option}" in section or f", {option}" in section, f"{command} {name} {option}"


def test_the_page_does_not_follow_the_terminal(monkeypatch) -> None:
    """A narrow or wide terminal renders the same page (argparse's own help would wrap to it)."""
    monkeypatch.setenv("COLUMNS", "40")
    narrow = GEN.render()
    monkeypatch.setenv("COLUMNS", "300")
    assert GEN.render() == narrow
