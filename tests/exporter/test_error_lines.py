"""An error ends a command on a line of its own, after whatever progress bar it interrupted
(issue 44): tqdm leaves a bar as a carriage return and the bar, no newline, so the error was glued
onto the bar's line, and the bar drawn again after it once collected. What reads the last line of
stderr (bench/zoo.py's table, a user's grep) read the bar."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("torch")

import exporter._build  # noqa: E402
from exporter.cli import main  # noqa: E402
from exporter._graph import find_cut_points  # noqa: E402


def test_a_build_failing_under_its_progress_bar_prints_its_error_on_a_line_of_its_own(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def wrong(traced):  # a record the head contradicts: the build fails inside the splits' bar
        return [dataclasses.replace(c, bytes_per_sample=1) if c.id == "_4" else c for c in find_cut_points(traced)]
    monkeypatch.setattr(exporter._build, "find_cut_points", wrong)
    assert main(["build", "exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28", "--splits", "_4",
                 "--out", str(tmp_path / "bundle")]) == 2
    err = capsys.readouterr().err
    assert "exporting fmnist_vgg splits" in err  # the bar was drawn, and the error came under it
    lines = err.rstrip("\n").split("\n")
    assert lines[-1].startswith("split-export: error: split _4: the manifest records 1 bytes per sample"), lines[-2:]
    assert err.endswith("\n") and err.count("split-export: error:") == 1
