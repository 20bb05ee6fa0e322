"""split-export deploy against real OpenSSH servers: every board ends whole on the new release or untouched.

The boards (tests/deploy/conftest.py) are sshd processes on 127.0.0.1, each with its own user,
home and host key, running splitedge installed from its wheel; the deploy is this checkout's
``split-export`` in a process of its own, reaching them with an ssh config file as a user's
``~/.ssh/config`` would.
"""

from __future__ import annotations

import json
import os
import re
import signal
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from device_runtime.bundle import BOARD_PART, HEAD, Bundle, write_manifest
from device_runtime._bundle_slice import slice_manifest
from exporter.deploy import Fleet, board_steps, probe
from exporter.deploy._remote_board import BoardResult
from splitedge.errors import DeployError
from tests.conftest import start_host
from testbed._ssh_boards import SshBoards, one_head_changed
from tests.deploy.conftest import needs_boards, split_export

pytestmark = needs_boards

ANSWER = re.compile(r"^#\d+\s+(\S+)\s+(.+?)\s+(\d\.\d{3})\s+split=(\S+)", re.M)


def answers(stdout: str) -> dict[str, tuple[str, float, str]]:
    """``split-device run``'s lines: photo -> (label, probability, split)."""
    return {m[1]: (m[2], float(m[3]), m[4]) for m in ANSWER.finditer(stdout)}


def deploy(fleet: SshBoards, bundle: Path | None, *boards: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    to = [arg for board in boards for arg in ("--to", board)]
    return split_export("deploy", *([str(bundle)] if bundle else []), *to, "--ssh-config", str(fleet.ssh_config),
                        *extra)


def slice_id(bundle: Path) -> str:
    """The bundle_id of the board slice a deploy of ``bundle`` installs (a slice's id is its content's)."""
    manifest, _ = slice_manifest(Bundle.load(bundle, roles=()), BOARD_PART)
    with tempfile.TemporaryDirectory() as tmp:
        return write_manifest(tmp, manifest).bundle_id


@pytest.fixture(scope="module")
def changed_bundle(mobilenet_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return one_head_changed(mobilenet_bundle, tmp_path_factory.mktemp("changed") / "bundle")


def reference(bundle: Path, photos: Path, split: str, host: str | None = None) -> dict[str, tuple[str, float, str]]:
    import sys
    argv = [sys.executable, "-m", "device_runtime.cli", "run", str(bundle), "--camera", str(photos), "--split", split,
            "--verbose"]
    out = subprocess.run([*argv, *(["--host", host] if host else [])], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return answers(out.stdout)


def same_answers(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys() and len(got) == 4
    for photo, (label, probability, split) in expected.items():
        assert got[photo][0] == label and got[photo][2] == split
        assert abs(got[photo][1] - probability) <= 0.002  # float32 ONNX on the same CPU, printed to 3 places


def test_a_fleet_deploys_and_the_full_disk_fails_alone(make_boards, mobilenet_bundle: Path, photos_dir: Path) -> None:
    fleet = make_boards(board1={}, board2={"disk_mb": 8}, board3={})
    photos = fleet.base / "photos"
    shutil.copytree(photos_dir, photos)
    photos.chmod(0o755)
    release = slice_id(mobilenet_bundle)
    for host in start_host([mobilenet_bundle]):
        address = f"127.0.0.1:{host.port}"
        out = deploy(fleet, mobilenet_bundle, "board1", "board2", "board3",
                     extra=("--max-fail", "50%", "--host", address))
        assert out.returncode == 1, out.stdout + out.stderr
        assert re.search(rf"^board1: current {release} \(was none\), [\d.]+ MB by rsync", out.stdout, re.M)
        assert re.search(rf"^board3: current {release} \(was none\)", out.stdout, re.M)
        assert re.search(r"^board2: FAILED: not enough space under .*: 8 MB free, the release needs 17 MB; .*"
                         r"; current left as it was$", out.stdout, re.M), out.stdout
        assert out.stdout.rstrip().endswith("2 of 3 board(s) done, 1 failed")
        assert fleet["board1"].current() == fleet["board3"].current() == release
        assert fleet["board2"].current() is None and fleet["board2"].releases() == []
        # The deployed release, run by the board's own split-device over ssh, its host from the deployed settings.
        for split in ("local", "features_14_conv_2"):
            run = fleet.ssh("board1", f"~/splitedge/bin/split-device run ~/.local/share/splitedge/current "
                                      f"--camera {photos} --split {split} --verbose")
            assert run.returncode == 0, run.stdout + run.stderr
            same_answers(answers(run.stdout), reference(mobilenet_bundle, photos_dir, split,
                                                        address if split != "local" else None))
        config = fleet.ssh("board3", "~/splitedge/bin/split-device config --json")
        assert f'"value": "{address}"' in config.stdout and "device.toml" in config.stdout


def test_max_fail_stops_the_rollout_before_the_next_batch(make_boards, mobilenet_bundle: Path) -> None:
    fleet = make_boards(board2={"disk_mb": 8}, board1={}, board3={})
    out = deploy(fleet, mobilenet_bundle, "board2", "board1", "board3", extra=("--serial", "1", "--max-fail", "25%"))
    assert out.returncode == 1
    assert "stopped: 1 of 3 boards failed (33% > --max-fail 25%); not reached: board1, board3" in out.stdout
    assert out.stdout.rstrip().endswith("0 of 3 board(s) done, 1 failed, 2 not reached")
    assert all(fleet[b].current() is None and fleet[b].releases() == [] for b in ("board1", "board2", "board3"))
    # The same failure within what --max-fail allows: the rollout goes on.
    out = deploy(fleet, mobilenet_bundle, "board2", "board1", "board3", extra=("--serial", "1", "--max-fail", "34%"))
    assert out.returncode == 1 and "2 of 3 board(s) done, 1 failed" in out.stdout
    assert fleet["board1"].current() == fleet["board3"].current() == slice_id(mobilenet_bundle)


def fleet_of(boards: SshBoards, *names: str) -> Fleet:
    return Fleet(list(names), boards.ssh_config, say=lambda line: None)


def test_a_redeploy_sends_only_the_changed_head_and_rollback_goes_back(
    make_boards, mobilenet_bundle: Path, changed_bundle: Path,
) -> None:
    boards = make_boards(board1={})
    first_id, second_id = slice_id(mobilenet_bundle), slice_id(changed_bundle)
    assert first_id != second_id
    with fleet_of(boards, "board1") as fleet:
        (first,) = fleet.deploy(mobilenet_bundle).boards
        (second,) = fleet.deploy(changed_bundle).boards
        (again,) = fleet.deploy(changed_bundle).boards
    assert first.ok and second.ok and again.ok, (first.error, second.error, again.error)
    head = next(a for a in Bundle.load(changed_bundle, roles=()).manifest.splits[-1].artifacts if a.role == HEAD)
    release_bytes = sum(f.stat().st_size for f in (boards["board1"].root / "releases" / first_id).rglob("*")
                        if f.is_file())
    assert first.sent_bytes > 0.9 * release_bytes and first.method == "rsync"
    # The changed head and the manifest, plus rsync's file list: never the unchanged files.
    assert head.bytes <= second.sent_bytes < head.bytes + 64_000, (second.sent_bytes, head.bytes)
    assert again.sent_bytes == 0 and again.method == ""  # already there and whole: nothing sent
    assert boards["board1"].current() == second_id and boards["board1"].releases() == sorted([first_id, second_id])
    unchanged = next(a for a in Bundle.load(mobilenet_bundle, roles=()).manifest.full)
    a = (boards["board1"].root / "releases" / first_id / unchanged.path).stat()
    b = (boards["board1"].root / "releases" / second_id / unchanged.path).stat()
    assert a.st_ino == b.st_ino  # hard-linked on the board, not a second copy
    out = deploy(boards, None, "board1", extra=("--rollback",))
    assert out.returncode == 0 and f"board1: current {first_id} (was {second_id})" in out.stdout
    assert boards["board1"].current() == first_id


def test_an_upload_that_does_not_verify_on_the_board_is_removed_and_current_stays(
    make_boards, mobilenet_bundle: Path, changed_bundle: Path, tmp_path: Path,
) -> None:
    boards = make_boards(board1={})
    with fleet_of(boards, "board1") as fleet:
        assert fleet.deploy(mobilenet_bundle).ok
        release = fleet.slice(changed_bundle, tmp_path, None, None)
        remote = fleet.remote("board1")
        facts = probe(remote)
        steps, undo = board_steps(remote, facts, release, {}, 3, BoardResult("board1"))
        dict(steps)["upload"]()
        incoming = boards["board1"].root / "releases" / f".incoming-{release.id}"
        head = next(a for a in release.manifest.splits[-1].artifacts if a.role == HEAD)
        with open(incoming / head.path, "r+b") as fh:  # a bit flipped on the way (an SD card, a link)
            fh.seek(1000)
            byte = fh.read(1)
            fh.seek(1000)
            fh.write(bytes([byte[0] ^ 1]))
        where = re.escape(head.path)  # a chain's id has a '+'
        with pytest.raises(DeployError, match=rf"^board1: the upload does not verify on the board: .*{where}.*"
                                              r"it was removed; deploy again"):
            dict(steps)["verify"]()
    assert not incoming.exists() and undo == []
    assert boards["board1"].current() == slice_id(mobilenet_bundle) and len(boards["board1"].releases()) == 1


def test_a_deploy_stopped_after_any_step_leaves_a_whole_current(
    make_boards, mobilenet_bundle: Path, changed_bundle: Path, tmp_path: Path,
) -> None:
    """A deploy killed (or a board losing power) between any two steps: current is the old release or the new."""
    boards = make_boards(board1={})
    board = boards["board1"]
    old_id, new_id = slice_id(mobilenet_bundle), slice_id(changed_bundle)
    with fleet_of(boards, "board1") as fleet:
        assert fleet.deploy(mobilenet_bundle).ok
        release = fleet.slice(changed_bundle, tmp_path, None, None)
        remote = fleet.remote("board1")
        names = [name for name, _ in board_steps(remote, probe(remote), release, {"threads": "2"}, 3,
                                                 BoardResult("board1"))[0]]
        for stop_after in range(len(names) + 1):
            board.as_user(str(board.home / "splitedge/bin/split-device"), "switch", old_id, "--root", str(board.root))
            shutil.rmtree(board.root / "releases" / new_id, ignore_errors=True)
            steps, _ = board_steps(remote, probe(remote), release, {"threads": "2"}, 3, BoardResult("board1"))
            for _, step in steps[:stop_after]:
                step()
            status = board.as_user(str(board.home / "splitedge/bin/split-device"), "status", "--root",
                                   str(board.root), "--json")
            assert status.returncode == 0, (names[:stop_after], status.stdout)
            expected = new_id if "switch" in names[:stop_after] else old_id
            assert board.current() == expected, names[:stop_after]
        # After a stop anywhere, the next deploy completes.
        assert fleet.deploy(changed_bundle).ok and board.current() == new_id


def test_a_setting_the_board_refuses_puts_the_release_and_the_settings_back(
    make_boards, mobilenet_bundle: Path, changed_bundle: Path,
) -> None:
    boards = make_boards(board1={})
    board = boards["board1"]
    assert deploy(boards, mobilenet_bundle, "board1", extra=("--host", "127.0.0.1:7767")).returncode == 0
    with open(board.home / ".config/splitedge/device.toml", "a", encoding="utf-8") as fh:
        fh.write("# réglages de la caméra du salon\n")  # the user's own words, not ASCII: put back byte for byte
    settings = (board.home / ".config/splitedge/device.toml").read_bytes()
    out = deploy(boards, changed_bundle, "board1", extra=("--set", "threads=many", "--camera", "picam"))
    assert out.returncode == 1
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("board1:")]
    assert re.fullmatch(rf"board1: FAILED: split-device config failed \(exit 2\): --set threads: .*'many'.*; "
                        rf"rolled back to "
                        rf"{slice_id(mobilenet_bundle)}", line), line
    assert board.current() == slice_id(mobilenet_bundle)
    assert (board.home / ".config/splitedge/device.toml").read_bytes() == settings


def test_a_field_trial_holding_the_update_lock_defers_the_switch(
    make_boards, mobilenet_bundle: Path, changed_bundle: Path,
) -> None:
    boards = make_boards(board1={})
    board = boards["board1"]
    assert deploy(boards, mobilenet_bundle, "board1").returncode == 0
    trial = subprocess.Popen(["runuser", "-u", board.user, "--", "flock", "-s", str(board.root / "updates.lock"),
                              "sleep", "60"], start_new_session=True)
    try:
        for _ in range(100):  # until the trial holds it
            probe_lock = subprocess.run(["flock", "-n", "-x", str(board.root / "updates.lock"), "true"])
            if probe_lock.returncode != 0:
                break
            subprocess.run(["sleep", "0.05"])
        out = deploy(boards, changed_bundle, "board1")
        assert out.returncode == 1
        assert "board1: FAILED: a field trial holds updates.lock there: the switch is deferred (the release is " \
               "installed); deploy again when the trial ends; current left as it was" in out.stdout
        assert board.current() == slice_id(mobilenet_bundle) and slice_id(changed_bundle) in board.releases()
    finally:
        os.killpg(trial.pid, signal.SIGKILL)  # runuser, flock and sleep: the lock goes with the last
        trial.wait()
    out = deploy(boards, changed_bundle, "board1")
    assert out.returncode == 0 and board.current() == slice_id(changed_bundle)


def test_json_is_the_outcome_as_one_object_the_lines_on_stderr(make_boards, mobilenet_bundle: Path) -> None:
    fleet = make_boards(board1={}, board2={"disk_mb": 8})
    out = deploy(fleet, mobilenet_bundle, "board1", "board2", extra=("--max-fail", "50%", "--json"))
    assert out.returncode == 1, out.stdout + out.stderr
    summary = json.loads(out.stdout)  # the whole of stdout
    assert (summary["ok"], summary["boards_given"], summary["done"], summary["failed"]) == (False, 2, 1, 1)
    boards = {b["board"]: b for b in summary["boards"]}
    assert boards["board1"]["ok"] and boards["board1"]["current"] == slice_id(mobilenet_bundle)
    assert boards["board1"]["before"] is None and boards["board1"]["method"] == "rsync"
    assert not boards["board2"]["ok"] and "not enough space" in boards["board2"]["error"]
    assert out.stderr.rstrip().endswith("1 of 2 board(s) done, 1 failed")
    dry = deploy(fleet, mobilenet_bundle, "board1", extra=("--dry-run", "--json"))
    assert dry.returncode == 0 and json.loads(dry.stdout)["dry_run"] is True


def test_dry_run_probes_and_prints_the_steps_and_changes_nothing(make_boards, mobilenet_bundle: Path) -> None:
    boards = make_boards(board1={}, board2={"installed": False})
    out = deploy(boards, mobilenet_bundle, "board1", "board2", extra=("--dry-run", "--camera", "picam"))
    assert out.returncode == 1, out.stderr  # board2 would fail: the dry run says so in its status too
    release = slice_id(mobilenet_bundle)
    splits = len(Bundle.load(mobilenet_bundle, roles=()).manifest.splits)  # the two cuts and their chain
    assert re.match(rf"would deploy {release} \(\d+\.\d MB, {splits} split\(s\)\) to 2 board\(s\)", out.stdout), out.stdout
    assert f"split-device switch {release} --root {boards['board1'].root} --keep 3" in out.stdout
    assert "config --set camera=picam --file" in out.stdout and "by rsync" in out.stdout
    assert "board2: cannot deploy: split-device is not installed" in out.stdout
    assert out.stdout.rstrip().endswith("1 of 2 board(s) would fail: board2")
    assert boards["board1"].current() is None and not (boards["board1"].root / "releases").exists()
    alone = deploy(boards, mobilenet_bundle, "board1", extra=("--dry-run",))  # every board could take it
    assert alone.returncode == 0 and "would fail" not in alone.stdout, alone.stdout + alone.stderr


def test_dry_run_exits_1_when_a_board_is_unreachable(make_boards, mobilenet_bundle: Path) -> None:
    """A board nothing answers for (a closed port on 127.0.0.1): the dry run names it with why, in one
    line, and exits 1, as the deploy would (it exited 0, as though the board could take the release)."""
    boards = make_boards(board1={}, board2={})
    text = boards.ssh_config.read_text()
    blocks = re.split(r"(?m)^(?=Host )", text)
    board2 = next(i for i, block in enumerate(blocks) if block.startswith("Host board2"))
    blocks[board2] = re.sub(r"(?m)^  Port .*$", "  Port 1", blocks[board2])
    boards.ssh_config.write_text("".join(blocks))
    out = deploy(boards, mobilenet_bundle, "board1", "board2", extra=("--dry-run", "--connect-timeout", "5"))
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("board2:")]
    assert line.startswith("board2: cannot deploy: nothing listens for ssh there"), line
    assert "board1: current none" in out.stdout  # the reachable board's steps, as before
    dry = deploy(boards, mobilenet_bundle, "board2", extra=("--dry-run", "--json", "--connect-timeout", "5"))
    assert dry.returncode == 1
    plan = json.loads(dry.stdout)
    assert plan["ok"] is False and list(plan["would_fail"]) == ["board2"]
    assert plan["would_fail"]["board2"].startswith("nothing listens for ssh there")


OLD_PYTHON = "#!/bin/sh\necho 3.9\n"  # answers as Python 3.9 would to the probe's version question


@pytest.mark.parametrize("spec, ssh_change, message", [
    ({"installed": False}, None, "split-device is not installed (not on PATH, not in ~/splitedge/bin or "
                                 "~/.local/bin): install it there: python3 -m venv"),
    ({"installed": False, "files": {"oldpy/python3": OLD_PYTHON,
                                    "splitedge/bin/split-device": "#!$HOME/oldpy/python3\n"}},
     None, "its Python is 3.9; splitedge needs 3.10 or newer"),
    ({}, ("Port", "1"), "nothing listens for ssh there"),
    ({}, ("IdentityFile", "/nonexistent/key"), "the board refused the login: check the user and that "
                                               "your key is in its ~/.ssh/authorized_keys"),
    ({}, ("UserKnownHostsFile", "/dev/null"), "its host key is unknown or changed"),
])
def test_a_board_that_cannot_take_a_release_is_one_line_and_untouched(
    make_boards, mobilenet_bundle: Path, spec: dict, ssh_change: tuple[str, str] | None, message: str,
) -> None:
    boards = make_boards(board1=spec)
    if ssh_change is not None:
        name, value = ssh_change
        text = boards.ssh_config.read_text()
        boards.ssh_config.write_text(re.sub(rf"(?m)^  {name} .*$", f"  {name} {value}", text))
    out = deploy(boards, mobilenet_bundle, "board1", extra=("--connect-timeout", "5"))
    assert out.returncode == 1 and out.stderr == ""
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("board1:")]
    assert line.startswith("board1: FAILED: " + message) and line.endswith("; current left as it was"), line
    assert boards["board1"].current() is None


def test_bad_arguments_are_one_line(make_boards, tmp_path: Path) -> None:
    out = split_export("deploy", str(tmp_path / "nothing"), "--to", "board1")
    assert out.returncode == 2 and out.stderr.startswith("split-export: error: ") and "nothing" in out.stderr
    out = split_export("deploy", "--to", "pi@board1", "--max-fail", "120%")
    assert out.returncode == 2 and "--max-fail '120%': must lie between 0% and 100%" in out.stderr
    out = split_export("deploy", str(tmp_path), "--rollback", "--to", "pi@board1")
    assert out.returncode == 2 and "split-export: error: --rollback takes no bundle" in out.stderr


def test_service_on_a_board_without_systemd_is_refused_and_the_release_rolled_back(
    make_boards, mobilenet_bundle: Path, changed_bundle: Path,
) -> None:
    """No systemd runs here (nor on the test boards): the unit is written, systemd's absence is named,
    and the board goes back to the release it had. With systemd, the restart waits for READY=1."""
    boards = make_boards(board1={})
    assert deploy(boards, mobilenet_bundle, "board1").returncode == 0
    out = deploy(boards, changed_bundle, "board1", extra=("--service",))
    assert out.returncode == 1
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("board1:")]
    expected = ("board1: FAILED: the service did not start: not running: systemd is not running on this machine "
                "(no /run/systemd/system)" if shutil.which("sudo") else
                "board1: FAILED: --service needs root there and it has no sudo: install sudo, or deploy as root")
    assert line == f"{expected}; rolled back to {slice_id(mobilenet_bundle)}"
    assert boards["board1"].current() == slice_id(mobilenet_bundle)
    dry = deploy(boards, changed_bundle, "board1", extra=("--service", "--dry-run"))
    if shutil.which("sudo"):  # systemd's absence is the board's to find: the dry run cannot know it
        assert dry.returncode == 0, dry.stdout + dry.stderr
        assert f"install-service --root {boards['board1'].root} --user {boards['board1'].user}" in dry.stdout
    else:  # the dry run knows this one: the board would fail, and says so
        assert dry.returncode == 1, dry.stdout + dry.stderr
        assert "board1: cannot deploy: --service needs root there and it has no sudo" in dry.stdout


def test_a_first_deploy_that_fails_after_its_switch_leaves_no_release_current(
    make_boards, mobilenet_bundle: Path,
) -> None:
    boards = make_boards(board1={})
    out = deploy(boards, mobilenet_bundle, "board1", extra=("--set", "threads=many"))
    assert out.returncode == 1
    assert out.stdout.splitlines()[1].endswith("; rolled back to no release current, as before"), out.stdout
    assert boards["board1"].current() is None
    assert not (boards["board1"].home / ".config/splitedge/device.toml").exists()


def test_a_file_changed_within_the_same_second_is_sent_not_linked(make_boards, tmp_path: Path) -> None:
    """rsync's quick check compares size and time; at its default, whole seconds. A release sliced
    within the second of the last one, whose manifest had the same size, once had the old
    manifest hard-linked in (and failed the board's verification): the upload must send it."""
    from exporter.deploy._remote import Remote

    boards = make_boards(board1={})
    home = boards["board1"].home
    second = 1_700_000_000
    for name, text, ns in (("old", "a" * 100, 100), ("new", "b" * 100, 900)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(text)
        os.utime(tmp_path / name / "manifest.json", ns=(second * 10**9 + ns,) * 2)
    control = Path(tempfile.mkdtemp(prefix="ctl-", dir="/tmp"))  # short: a socket path has a length limit
    remote = Remote("board1", control, boards.ssh_config)
    try:
        remote.upload(tmp_path / "old", str(home / "r1"), None, rsync_on_board=True)
        remote.upload(tmp_path / "new", str(home / "r2"), "../r1", rsync_on_board=True)
    finally:
        remote.close()
        shutil.rmtree(control, ignore_errors=True)
    assert (home / "r2" / "manifest.json").read_text() == "b" * 100
    assert (home / "r1" / "manifest.json").stat().st_ino != (home / "r2" / "manifest.json").stat().st_ino
