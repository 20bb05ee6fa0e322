"""The board's settings parsers under any input (hypothesis, pinned in the dev extra): every key's
check, ``--set`` into device.toml and a file's values answer a value the run can use or one line
naming the key; the numbers stay within their stated bounds (issue 45: ``threads=100000`` was
accepted and the run died in SIGSEGV)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from device_runtime.board import run_checker, write_settings
from device_runtime.board.run_settings import KEYS, SettingError, batches
from device_runtime.board.run_settings import FRAME_SIDE, THREADS
from device_runtime.board._settings import load_settings
from splitedge import bounds_of
from splitedge.errors import ConfigError

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

NUMERIC = sorted(name for name, key in KEYS.items() if bounds_of(key.check) is not None)

values = st.one_of(
    st.text(max_size=16),
    st.floats().map(repr), st.integers(-10**13, 10**13).map(str),
    st.sampled_from(["nan", "inf", "-inf", "1e999", "100000", "0", "-1", "8193x480", "640x0", "1,2,2000", "4,,8"]),
)


def test_the_numeric_keys_are_the_ones_expected() -> None:
    assert {"threads", "batch", "timeout", "deadline_ms", "frame"} <= set(NUMERIC)
    assert THREADS.high == 256 and FRAME_SIDE.high == 8192


@FAST
@given(st.sampled_from(NUMERIC), values)
def test_a_numeric_key_answers_a_value_in_its_bounds_or_one_line(name: str, text: str) -> None:
    key = KEYS[name]
    limits = bounds_of(key.check)
    try:
        value = key.check(text)
    except SettingError as exc:
        assert "\n" not in str(exc).replace(repr(text), "") and "expected" in str(exc)
        return
    for number in value if isinstance(value, tuple) else (value,):
        assert math.isfinite(number) and limits.contains(number), (name, text, value)


@FAST
@given(values)
def test_batch_sizes_are_each_within_the_bound_or_refused(text: str) -> None:
    try:
        found = batches(text)
    except SettingError as exc:
        assert "from 1 to 1024" in str(exc)
        return
    assert found and list(found) == sorted(set(found)) and all(1 <= b <= 1024 for b in found)


@FAST
@given(st.sampled_from(NUMERIC), values)
def test_set_writes_what_a_reader_loads_back_or_leaves_the_file(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / "device.toml"
    path.write_text("threads = 2\n")
    try:
        write_settings(path, {name: text})
    except ConfigError as exc:
        assert f"--set {name}: {name}: " in str(exc) and "\n" not in str(exc).replace(repr(text), "")
        assert path.read_text() == "threads = 2\n"
        return
    loaded = load_settings(run_checker(), environ={}, files=[path]).values
    assert loaded[name].value == KEYS[name].check(text)


@pytest.mark.parametrize("line", ["threads = 100000", "threads = -1", "timeout = nan", "timeout = inf",
                                  "deadline_ms = 1e12", 'frame = "100000x100000"', "batch = 0"])
def test_a_file_saying_what_no_flag_may_is_one_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "device.toml"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError) as info:
        load_settings(run_checker(), environ={}, files=[path])
    message = str(info.value)
    assert str(path) in message and line.split(" ")[0] in message and "\n" not in message and "expected" in message


@pytest.mark.parametrize("spec", ["synthetic:nan", "synthetic:inf", "synthetic:-1", "synthetic:1e12",
                                  "picam:100000x100000", "picam:0x480", "picam@0", "picam@5000", "picam99999"])
def test_a_camera_spec_s_numbers_are_checked_where_it_enters(spec: str) -> None:
    with pytest.raises(SettingError, match=r"^camera .*expected .* to 1000"):
        KEYS["camera"].check(spec)


@pytest.mark.parametrize("spec", ["synthetic", "synthetic:15", "synthetic:0", "picam", "picam1:1280x720@15",
                                  "picam@7.5", "0", "2", "clip.mp4", "photos/", "picam.mp4"])
def test_a_camera_spec_in_range_or_not_a_spec_at_all_is_taken(spec: str) -> None:
    assert KEYS["camera"].check(spec) == spec
