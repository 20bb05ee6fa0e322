"""Bundles cannot reach outside themselves: attacks by a user who forges a manifest (issue 27, point 7).

A manifest's identity is a content hash anyone can recompute, so every attack here edits the
manifest of a real bundle on disk and stamps it again, as an attacker would. Each one must be
refused, in one line naming the file and what to do, by every reader of bundles: ``split-device
verify`` (:func:`verify_files`), :meth:`Bundle.load` as ``split-host serve`` loads its tails,
``split-export slice`` and the board's release steps (:meth:`Layout.install`, the deploy's steps).
Before this was fixed a tail at ``../outside.onnx`` passed ``verify``, was loaded by ``serve`` and
was written beside the slice; ``/proc/self/pagemap`` hung all three.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from device_runtime.board._release import Layout
from device_runtime.bundle import (
    BOARD_PART, FULL, HOST_PART, MANIFEST_NAME, TAIL, Bundle, manifest_digest, verify_files,
)
from device_runtime._bundle_slice import slice_bundle
from splitedge.errors import BundleError
from tests.device_runtime.test_bundle_slice import fake_bundle

ROOT = Path(__file__).resolve().parents[2]
#: Every attack must be refused well within this: a reader that hashes /proc/self/pagemap never ends.
pytestmark = pytest.mark.timeout(120)

TAIL_PATH = "tail/a.onnx"  # the float32 ONNX tail of split "a" in fake_bundle


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def forge(bundle: Path, edit: Callable[[dict], None]) -> None:
    """Edit ``bundle``'s manifest and stamp it with the identity its new content gives."""
    path = bundle / MANIFEST_NAME
    data = json.loads(path.read_text())
    edit(data)
    data["manifest_sha256"] = manifest_digest(data)
    data["bundle_id"] = f"{data['model']['name']}-{data['manifest_sha256'][:12]}"  # as bundle_id() makes it
    path.write_text(json.dumps(data, indent=2))


def point_tail_at(bundle: Path, relpath: str, content: bytes) -> None:
    """The tail of split ``a`` says it is at ``relpath``, with the hash and size of ``content``."""

    def edit(data: dict) -> None:
        tail = next(a for a in data["splits"][0]["artifacts"] if a["path"] == TAIL_PATH)
        tail.update(path=relpath, sha256=_sha256(content), bytes=len(content))

    forge(bundle, edit)


def _dotdot(bundle: Path) -> str:
    outside = bundle.parent / "outside.onnx"
    outside.write_bytes(b"not yours" * 8)
    point_tail_at(bundle, "../outside.onnx", outside.read_bytes())
    return "../outside.onnx"


def _absolute(bundle: Path) -> str:
    secret = bundle.parent / "secret.onnx"
    secret.write_bytes(b"secret" * 8)
    point_tail_at(bundle, str(secret), secret.read_bytes())
    return str(secret)


def _passwd(bundle: Path) -> str:
    relpath = "../../../../../../../../../../etc/passwd"
    point_tail_at(bundle, relpath, Path("/etc/passwd").read_bytes())
    return relpath


def _symlink_out(bundle: Path) -> str:
    outside = bundle.parent / "outside.onnx"
    outside.write_bytes(b"not yours" * 8)
    (bundle / TAIL_PATH).unlink()
    (bundle / TAIL_PATH).symlink_to(outside)
    point_tail_at(bundle, TAIL_PATH, outside.read_bytes())
    return TAIL_PATH


def _pagemap(bundle: Path) -> str:
    (bundle / TAIL_PATH).unlink()
    (bundle / TAIL_PATH).symlink_to("/proc/self/pagemap")
    point_tail_at(bundle, TAIL_PATH, b"")  # procfs says 0 bytes, and gives gigabytes
    return TAIL_PATH


def _pagemap_absolute(bundle: Path) -> str:
    point_tail_at(bundle, "/proc/self/pagemap", b"")
    return "/proc/self/pagemap"


def _fifo(bundle: Path) -> str:
    content = (bundle / TAIL_PATH).read_bytes()
    (bundle / TAIL_PATH).unlink()
    os.mkfifo(bundle / TAIL_PATH)  # opening it to read waits for a writer that never comes
    point_tail_at(bundle, TAIL_PATH, content)
    return TAIL_PATH


ATTACKS = {
    "dotdot": (_dotdot, "inside the bundle"),
    "absolute": (_absolute, "relative"),
    "etc-passwd": (_passwd, "inside the bundle"),
    "symlink-out": (_symlink_out, "leads outside the bundle"),
    "proc-pagemap": (_pagemap, "leads outside the bundle"),
    "proc-pagemap-absolute": (_pagemap_absolute, "relative"),
    "fifo": (_fifo, "not a regular file"),
}


@pytest.fixture(params=sorted(ATTACKS))
def attacked(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str, str]:
    """(the forged bundle, the path its manifest gives the tail, what the refusal must say)."""
    bundle = tmp_path / "d" / "bundle"
    fake_bundle(bundle)
    make, says = ATTACKS[request.param]
    return bundle, make(bundle), says


def assert_one_clear_line(message: str, relpath: str, says: str) -> None:
    assert "\n" not in message.strip(), message
    assert relpath in message, message  # names the file
    assert says in message, message  # says what is wrong
    assert "re-export" in message or "copy the bundle again" in message, message  # and what to do


def test_verify_refuses_it(attacked: tuple[Path, str, str]) -> None:
    bundle, relpath, says = attacked
    manifest, problems = verify_files(bundle)
    assert problems, "a forged bundle passed verify"
    assert len(problems) == 1, problems
    assert_one_clear_line(problems[0], relpath, says)


def test_serve_refuses_to_load_it(attacked: tuple[Path, str, str]) -> None:
    bundle, relpath, says = attacked
    with pytest.raises(BundleError) as refused:
        Bundle.load(bundle, roles=(TAIL, FULL))  # what split-host serve loads
    assert_one_clear_line(str(refused.value), relpath, says)


def test_slice_refuses_it_and_writes_nothing_outside(attacked: tuple[Path, str, str]) -> None:
    bundle, relpath, says = attacked
    out = bundle.parent / "sliced" / "slice"
    before = sorted(p.name for p in bundle.parent.iterdir())
    with pytest.raises(BundleError) as refused:
        slice_bundle(bundle, out, HOST_PART)
    assert_one_clear_line(str(refused.value), relpath, says)
    assert not out.exists()
    assert sorted(p.name for p in bundle.parent.iterdir() if p.name != "sliced") == before  # nothing beside it
    sliced = bundle.parent / "sliced"
    assert not sliced.exists() or os.listdir(sliced) == []  # and no staging left where it was to go


def test_the_boards_release_steps_refuse_it(attacked: tuple[Path, str, str], tmp_path: Path) -> None:
    bundle, relpath, says = attacked
    layout = Layout(tmp_path / "board")
    with pytest.raises(BundleError) as refused:
        layout.install(bundle)
    assert_one_clear_line(str(refused.value), relpath, says)
    assert not layout.releases.exists() or os.listdir(layout.releases) == []  # no release, no staging


def _device(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "device_runtime.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def _export(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exporter.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("attack", ["dotdot", "etc-passwd", "proc-pagemap"])
def test_the_commands_refuse_it_in_one_line(attack: str, tmp_path: Path) -> None:
    """``split-device verify`` and ``split-export slice`` as a user types them: one line, no traceback."""
    bundle = tmp_path / "d" / "bundle"
    fake_bundle(bundle)
    make, says = ATTACKS[attack]
    relpath = make(bundle)
    verify = _device("verify", str(bundle))
    assert verify.returncode == 1, verify.stdout + verify.stderr
    assert len(verify.stdout.splitlines()) == 1 and not verify.stderr, verify.stdout + verify.stderr
    assert_one_clear_line(verify.stdout, relpath, says)
    sliced = _export("slice", str(bundle), "--for", "host", "--out", str(tmp_path / "d" / "slice"))
    assert sliced.returncode == 2, sliced.stdout + sliced.stderr
    assert len(sliced.stderr.splitlines()) == 1, sliced.stderr
    assert_one_clear_line(sliced.stderr, relpath, says)
    assert not (tmp_path / "d" / "slice").exists() and not (tmp_path / "d" / "outside.onnx.1").exists()


def test_a_file_larger_than_its_manifest_says_is_refused_before_it_is_hashed(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    fake_bundle(bundle)
    (bundle / TAIL_PATH).write_bytes(b"x" * 4096)  # the manifest says 64
    with pytest.raises(BundleError, match=r"tail/a\.onnx: 4,096 bytes, the manifest says 64"):
        Bundle.load(bundle, roles=(TAIL,))


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge", "not-utf8", "deep"])
def test_a_manifest_that_is_no_file_or_no_json_is_refused_in_one_line(kind: str, tmp_path: Path) -> None:
    """The manifest itself is untrusted (issue 45): a FIFO hung its reader, a link to /dev/zero was
    read until memory ran out; each is one BundleError naming the manifest, read at most 16 MiB."""
    bundle = tmp_path / "bundle"
    fake_bundle(bundle)
    manifest = bundle / MANIFEST_NAME
    manifest.unlink()
    if kind == "fifo":
        os.mkfifo(manifest)
    elif kind == "dev-zero":
        manifest.symlink_to("/dev/zero")
    elif kind == "huge":
        manifest.write_bytes(b"{" + b" " * (16 << 20) + b"}")
    elif kind == "not-utf8":
        manifest.write_bytes(b'{"a": "' + bytes([0xFF, 0xFE]) + b'"}')
    else:
        manifest.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BundleError, match=f"^{bundle / MANIFEST_NAME}: (cannot read the manifest|not valid JSON)") as raised:
        Bundle.load(bundle)
    assert "\n" not in str(raised.value)


# --- names: a model name becomes the bundle id, and a bundle id names a directory on the board ---

ESCAPING_NAME = "x/../../../escaped"


def _renamed(bundle: Path, name: str) -> None:
    forge(bundle, lambda data: data["model"].update(name=name))


@pytest.mark.parametrize("name", [ESCAPING_NAME, "..", ".hidden", "-rf", "a b", "x\ny", "é" * 3, "a" * 200])
def test_an_unsafe_model_name_is_refused_by_every_reader(name: str, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    fake_bundle(bundle)
    _renamed(bundle, name)
    for read in (lambda: Bundle.load(bundle, roles=()), lambda: slice_bundle(bundle, tmp_path / "s", BOARD_PART),
                 lambda: Layout(tmp_path / "board").install(bundle)):
        with pytest.raises(BundleError) as refused:
            read()
        message = str(refused.value)
        assert "model.name" in message and "letters, digits" in message and "re-export" in message, message
        assert "\n" not in message
    assert not (tmp_path / "s").exists() and not (tmp_path / "escaped").exists()
    assert verify_files(bundle)[1] and "model.name" in verify_files(bundle)[1][0]


def test_names_that_exporters_make_are_safe(tmp_path: Path) -> None:
    """torchvision's names and Python factories' stay as they were."""
    for name in ("mobilenet_v2", "resnet18", "make_net", "fmnist_vgg", "efficientnet_b0", "MyNet.v2", "_private"):
        bundle = tmp_path / name
        fake_bundle(bundle)
        _renamed(bundle, name)
        assert Bundle.load(bundle, roles=()).manifest.bundle_id.startswith(f"{name}-")


def test_deploy_refuses_an_escaping_name_before_it_reaches_a_board(tmp_path: Path) -> None:
    """``split-export deploy``: before, the board slice was uploaded and ``mv``'d to
    ``releases/x/../../../escaped-<hex>``, which is ``~/.local/share/escaped-<hex>``."""
    bundle = tmp_path / "bundle"
    fake_bundle(bundle)
    _renamed(bundle, ESCAPING_NAME)
    out = _export("deploy", str(bundle), "--to", "nobody@127.0.0.1", "-o", "Port=9", "--connect-timeout", "2")
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(out.stderr.splitlines()) == 1 and "model.name" in out.stderr, out.stderr


def test_the_deploys_board_steps_keep_a_release_under_releases(tmp_path: Path) -> None:
    """A release whose id did not come through a manifest (a caller's bug) is refused by the deploy's own
    steps before any command reaches the board: one resolver names releases there and here."""
    from dataclasses import replace

    from exporter.deploy import BoardFacts, BoardResult, Release, board_steps

    bundle = tmp_path / "bundle"
    manifest = fake_bundle(bundle)
    sent: list[str] = []

    class Board:
        destination = "pi@board"

        def run(self, command: str, **_: object) -> subprocess.CompletedProcess[str]:
            sent.append(command)
            return subprocess.CompletedProcess(command, 1, "", "")

    facts = BoardFacts(split_device="/home/pi/splitedge/bin/split-device", python_version=(3, 11), rsync=True,
                       root="/home/pi/.local/share/splitedge", current=None, free_bytes=1 << 30,
                       config="/home/pi/.config/splitedge/device.toml")
    release = Release(bundle, replace(manifest, bundle_id=f"{ESCAPING_NAME}-0123456789ab"), 1000)
    with pytest.raises(BundleError, match="bundle id"):
        board_steps(Board(), facts, release, {}, 3, BoardResult(board="pi@board"))  # type: ignore[arg-type]
    assert sent == []
