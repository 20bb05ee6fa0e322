"""The board's releases: install, an atomic switch no kill can break, the update lock, rollback, pruning."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from device_runtime.board._release import Layout, UpdateDeferred, default_root
from device_runtime.bundle import Bundle, verify_files
from splitedge.errors import BundleError
from tests.device_runtime.test_bundle_slice import fake_bundle

ROOT = Path(__file__).resolve().parents[3]


def make_release(layout: Layout, tmp_path: Path, name: str, tflite_int8: tuple[str, ...]) -> str:
    """A distinct bundle (which heads have int8 TFLite differs, so the ids do), installed."""
    fake_bundle(tmp_path / name, int8_tflite_heads=tflite_int8)
    return layout.install(tmp_path / name)


def wait_until_held(lock: Path, held: bool = True, timeout: float = 10.0) -> None:
    """Until another process holds ``lock`` (or, ``held=False``, no longer does), probed without
    taking it for more than an instant."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock.exists():
            with open(lock) as fh:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    if held:
                        return
                else:
                    fcntl.flock(fh, fcntl.LOCK_UN)
                    if not held:
                        return
        time.sleep(0.02)
    raise AssertionError(f"{lock} still {'free' if held else 'held'} after {timeout} s")


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "splitedge")


@pytest.fixture
def two(layout: Layout, tmp_path: Path) -> tuple[str, str]:
    old = make_release(layout, tmp_path, "old", ("a",))
    new = make_release(layout, tmp_path, "new", ("b",))
    layout.switch(old)
    return old, new


def test_install_copies_a_verified_bundle_under_its_id(layout: Layout, tmp_path: Path) -> None:
    release = make_release(layout, tmp_path, "b1", ("a",))
    assert release == Bundle.load(tmp_path / "b1").manifest.bundle_id
    assert verify_files(layout.release(release))[1] == []
    assert layout.installed() == [release] and layout.current_id() is None
    assert make_release(layout, tmp_path, "b1-again", ("a",)) == release  # same content, same release


def test_install_refuses_a_corrupt_bundle_and_leaves_no_release(layout: Layout, tmp_path: Path) -> None:
    fake_bundle(tmp_path / "bad")
    (tmp_path / "bad" / "head" / "a.onnx").write_bytes(b"x" * 64)
    with pytest.raises(BundleError, match=r"a\.onnx: sha256 .* does not match"):
        layout.install(tmp_path / "bad")
    assert layout.installed() == []


def test_switch_is_a_relative_link_and_remembers_the_previous(layout: Layout, two: tuple[str, str]) -> None:
    old, new = two
    assert layout.switch(new) == old
    assert os.readlink(layout.current) == f"releases/{new}"
    assert layout.current_id() == new and layout.previous_id() == old
    assert Bundle.load(layout.current).manifest.bundle_id == new
    assert layout.rollback() == old and layout.current_id() == old


@pytest.mark.parametrize("steps_run", range(6))
def test_killed_at_each_step_of_a_switch_current_still_works(layout: Layout, two, steps_run: int) -> None:
    """SIGKILL after each step of the switch (a power cut, a killed deploy): ``current`` is the old
    release or the new one, whole, never missing; and the next switch cleans up and succeeds."""
    old, new = two
    names = [name for name, _ in layout.switch_steps(new)]
    assert steps_run <= len(names)
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from device_runtime.board._release import Layout\n"
        f"for _, step in Layout(Path({str(layout.root)!r})).switch_steps({new!r})[:{steps_run}]:\n"
        "    step()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    renamed = steps_run > names.index("rename")
    assert layout.current_id() == (new if renamed else old)
    assert verify_files(layout.current)[1] == []  # whole, through the link
    layout.switch(new)
    assert layout.current_id() == new
    assert sorted(p.name for p in layout.root.iterdir()) == ["current", "previous", "releases", "updates.lock"]


def test_a_switch_to_a_broken_release_leaves_current_alone(layout: Layout, two) -> None:
    old, new = two
    (layout.release(new) / "head" / "a.onnx").unlink()
    with pytest.raises(BundleError, match=f"release {new} is not whole, current left as it is"):
        layout.switch(new)
    assert layout.current_id() == old


def test_a_field_trial_holding_the_lock_defers_the_switch(layout: Layout, two) -> None:
    """Another process holds updates.lock with util-linux flock -s, as a field trial script would."""
    old, new = two
    flock = shutil.which("flock")
    if flock is None:
        pytest.skip("util-linux flock is not installed")
    trial = subprocess.Popen([flock, "-s", str(layout.lock_path), "sleep", "30"], start_new_session=True)
    try:
        wait_until_held(layout.lock_path)
        with pytest.raises(UpdateDeferred, match="updates.lock is held .* deferred"):
            layout.switch(new)
        assert layout.current_id() == old
    finally:
        os.killpg(trial.pid, signal.SIGKILL)  # flock and its sleep, which inherited the locked descriptor
        trial.wait()
    wait_until_held(layout.lock_path, held=False)  # the sleep may outlive flock by a moment
    layout.switch(new)
    assert layout.current_id() == new


def test_hold_updates_is_shared_by_trials_and_excludes_switches(layout: Layout, two) -> None:
    old, new = two
    with layout.hold_updates(), layout.hold_updates():  # two trials at once
        with pytest.raises(UpdateDeferred):
            layout.switch(new)
    layout.switch(new)
    assert layout.current_id() == new


def test_prune_keeps_current_previous_and_the_latest(layout: Layout, tmp_path: Path) -> None:
    ids = [make_release(layout, tmp_path, f"r{i}", heads) for i, heads in enumerate([(), ("a",), ("b",), ("a", "b")])]
    for release in ids:
        layout.switch(release)
        time.sleep(0.01)  # switch order is kept in the releases' mtimes
    assert layout.prune(keep=2) == ids[:2][::-1]
    assert set(layout.installed()) == {ids[3], ids[2]}
    assert (layout.current_id(), layout.previous_id()) == (ids[3], ids[2])


def test_default_root_follows_the_environment(tmp_path: Path) -> None:
    assert default_root({"SPLITEDGE_ROOT": str(tmp_path)}) == tmp_path
    assert default_root({"HOME": "/home/pi"}) == Path("/home/pi/.local/share/splitedge")
    assert default_root({"HOME": "/home/pi", "XDG_DATA_HOME": "/data"}) == Path("/data/splitedge")


def device(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "device_runtime.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_switch_and_rollback_commands_for_a_deploy(layout: Layout, two) -> None:
    old, new = two
    root = ["--root", str(layout.root)]
    out = device("switch", new, *root)
    assert (out.returncode, out.stdout) == (0, f"current: {new} (was {old})\n")
    with layout.hold_updates():  # a field trial
        out = device("rollback", *root)
        assert out.returncode == 3 and out.stdout.startswith("split-device: deferred: ")
    assert layout.current_id() == new
    out = device("rollback", *root)
    assert (out.returncode, out.stdout) == (0, f"current: {old} (was {new})\n")
    out = device("switch", "not-installed-000000000000", *root)
    assert out.returncode == 1 and "current left as it is" in out.stdout
    assert layout.current_id() == old


def test_a_bundle_loaded_through_current_stays_that_release_after_a_switch(layout: Layout, two) -> None:
    """A board running from current while a deploy switches it reads the files of the release it loaded."""
    old, new = two
    running = Bundle.load(layout.current)
    layout.switch(new)
    assert running.root == layout.release(old).resolve()
    assert all(running.verify(a).is_file() for a in running.all_artifacts())  # old files, old manifest: they match
