"""``--loop``: uvloop where it is installed (auto), asyncio's loop when asked, a clear error when uvloop is asked for and missing."""

from __future__ import annotations

import asyncio
import sys

import pytest

from host_runtime.cli import main
from host_runtime._event_loop import loop_runner
from splitedge.errors import SplitEdgeError


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.partition(".")[0]


def test_auto_takes_uvloop_where_installed() -> None:
    pytest.importorskip("uvloop")
    assert loop_runner("auto")(loop_module()) == "uvloop"
    assert loop_runner("asyncio")(loop_module()) == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_an_error(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    assert loop_runner("auto")(loop_module()) == "asyncio"
    with pytest.raises(SplitEdgeError, match=r"--loop uvloop: uvloop is not installed \(pip install uvloop\)"):
        loop_runner("uvloop")
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "bundle/", "--loop", "uvloop"])
    assert exit_.value.code == 2
    assert "split-host: error: --loop uvloop: uvloop is not installed" in capsys.readouterr().err
