"""A cut sent in a k-bit coding (issue 47): the board packs the head's output by the split's
coding, the host unpacks and dequantizes it on a worker before the tail, and the answer is the
tail's on exactly what a plain numpy decode gives; every frame a coding cannot account for is
refused in one line, and the host goes on serving."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import cv2
import numpy as np
import pytest

from device_runtime.bundle import HEAD, TAIL, Bundle
from device_runtime.engine import DeviceRunner, OnnxBackend
from device_runtime.link import HostClient
from device_runtime.wire import encode_bytes
from device_runtime.wire.coding import CutCoding, packed_bytes, unpack_bits
from splitedge.errors import BundleError, RemoteError
from tests.conftest import TEST_CODINGS, TEST_SPLITS, RunningHost, start_host
from tests.host_runtime.test_server import raw_connection, read_reply


@pytest.fixture(scope="module")
def coded(coded_bundle: Path) -> Bundle:
    return Bundle.load(coded_bundle)


@pytest.fixture(scope="module")
def coded_host(coded_bundle: Path):
    yield from start_host([coded_bundle])


@pytest.fixture(scope="module")
def photo_batch(coded: Bundle, photos_dir: Path) -> np.ndarray:
    """The photos (not mirrored: not what the codings were calibrated on) as the model's input."""
    runner = DeviceRunner(coded, threads=1)
    images = [cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in sorted(photos_dir.glob("*.png"))]
    return np.concatenate([runner.preprocess(image[::2, ::2].copy()) for image in images])


def infer(host: RunningHost, bundle: Bundle, split: str, tensor: np.ndarray, **fields):
    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            return await client.infer(bundle.id, split, tensor, **fields)
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.mark.parametrize("split_id", TEST_SPLITS)
@pytest.mark.parametrize("bits", TEST_CODINGS)
def test_a_coded_cut_is_answered_as_the_tail_answers_its_numpy_decode(
        coded_host: RunningHost, coded: Bundle, photo_batch: np.ndarray, split_id: str, bits: int) -> None:
    runner = DeviceRunner(coded, threads=1)
    cut = OnnxBackend(coded.artifact(split_id, HEAD)).run(photo_batch)
    sent, fields = runner.payload(f"{split_id}@k{bits}", cut)
    values = cut.size
    assert sent.dtype == np.uint8 and sent.nbytes == packed_bytes(values, bits) == cut.nbytes * bits // 32
    assert fields == {"dtype": "float32", "shape": list(cut.shape), "coding": f"k{bits}"}

    # The reference, in plain numpy: unpack, then real = scale[c] * (q - zero[c]).
    spec = coded.manifest.split(split_id).coding(f"k{bits}")
    q = unpack_bits(sent.tobytes(), values, bits).reshape(cut.shape).astype(np.float32)
    view = (1, -1, 1, 1)
    real = (q - np.asarray(spec.zero, np.float32).reshape(view)) * np.asarray(spec.scale, np.float32).reshape(view)
    expected = OnnxBackend(coded.artifact(split_id, TAIL)).run(real.astype(np.float32))

    result = infer(coded_host, coded, split_id, sent, **fields)
    assert np.allclose(result.output, expected, atol=1e-5, rtol=0)
    if bits == 8:  # eight bits a value keep the float model's answer on these photos
        full = OnnxBackend(coded.artifact(split_id, TAIL)).run(cut)
        assert (result.output.argmax(1) == full.argmax(1)).all()


def test_the_host_decodes_on_a_worker_not_the_event_loop(coded_host: RunningHost, coded: Bundle,
                                                        photo_batch: np.ndarray, monkeypatch) -> None:
    threads = []
    original = CutCoding.decode
    monkeypatch.setattr(CutCoding, "decode", lambda *a, **k: (threads.append(threading.current_thread()),
                                                               original(*a, **k))[1])
    cut = OnnxBackend(coded.artifact(TEST_SPLITS[1], HEAD)).run(photo_batch[:1])
    sent, fields = DeviceRunner(coded, threads=1).payload(f"{TEST_SPLITS[1]}@k4", cut)
    infer(coded_host, coded, TEST_SPLITS[1], sent, **fields)
    assert threads and all(t.name != "test-host" for t in threads)  # start_host's loop runs in "test-host"


def refusal(host: RunningHost, bundle: Bundle, split: str, data: bytes, **tensor_fields) -> str:
    """The host's one-line answer to an infer whose tensor map carries ``tensor_fields`` beside ``data``."""
    with raw_connection(host) as sock:
        sock.sendall(encode_bytes({"op": "infer", "id": 9, "bundle": bundle.id, "split": split},
                                  np.frombuffer(data, np.uint8), **tensor_fields))
        reply = read_reply(sock)
        assert reply["id"] == 9 and reply["error"]["code"] == "bad_request"
        sock.sendall(encode_bytes({"op": "ping", "id": 10}))
        assert read_reply(sock)["ok"] is True  # the connection, and the host, go on
    return reply["error"]["message"]


def test_every_frame_a_coding_cannot_account_for_is_refused_in_one_line(coded_host: RunningHost,
                                                                         coded: Bundle) -> None:
    split = coded.manifest.split(TEST_SPLITS[1])
    shape = [1, *split.tensor.shape]
    values = int(np.prod(shape))
    right = b"\0" * packed_bytes(values, 4)
    cases = {
        "unknown": (right, {"dtype": "float32", "shape": shape, "coding": "k5"}),
        "not in the bundle": (b"\0" * packed_bytes(values, 3), {"dtype": "float32", "shape": shape, "coding": "k3"}),
        "short": (right[:-1], {"dtype": "float32", "shape": shape, "coding": "k4"}),
        "long": (right + b"\0" * 4, {"dtype": "float32", "shape": shape, "coding": "k4"}),
        # a stream that would unpack to more values than its shape: its length says so first
        "more values": (b"\0" * packed_bytes(values * 2, 4), {"dtype": "float32", "shape": shape, "coding": "k4"}),
        "channels": (b"\0" * packed_bytes(values // 2, 4),
                     {"dtype": "float32", "shape": [1, shape[1] // 2, *shape[2:]], "coding": "k4"}),
        "dtype": (right, {"dtype": "uint8", "shape": shape, "coding": "k4"}),
        "scale": (right, {"dtype": "float32", "shape": shape, "coding": "k4", "scale": 0.1, "zero_point": 3}),
        "flat": (b"\0" * packed_bytes(values, 4), {"dtype": "float32", "shape": [values], "coding": "k4"}),
        "not a name": (right, {"dtype": "float32", "shape": shape, "coding": 4}),
    }
    messages = {case: refusal(coded_host, coded, split.id, data, **fields) for case, (data, fields) in cases.items()}
    assert "unknown cut coding 'k5': this side knows k8, k6, k4, k3, k2" in messages["unknown"]
    assert f"split {split.id} has no cut coding 'k3' (it has: k8, k4, k2)" in messages["not in the bundle"]
    packs = f"a k4 tensor of shape {shape} packs into {len(right)} bytes, frame carries"
    assert all(packs in messages[case] for case in ("short", "long", "more values"))
    assert f"a k4 cut has {shape[1]} channels (axis 1), the frame's shape is [1, {shape[1] // 2}," in messages["channels"]
    assert all("decodes to float32 [batch, channels, ...] and carries no scale" in messages[case]
               for case in ("dtype", "scale", "flat"))
    assert "unknown cut coding 4" in messages["not a name"]
    assert all("\n" not in message for message in messages.values())


def test_a_coded_cut_to_a_bundle_without_codings_is_refused_naming_what_to_do(host: RunningHost,
                                                                               mobilenet_bundle: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle)
    shape = [1, *bundle.manifest.split(TEST_SPLITS[0]).tensor.shape]
    message = refusal(host, bundle, TEST_SPLITS[0], b"\0" * packed_bytes(int(np.prod(shape)), 4),
                      dtype="float32", shape=shape, coding="k4")
    assert message.endswith("(it has: none); rebuild the bundle with split-export build --cut-bits")


def test_a_board_asked_for_a_coding_its_bundle_lacks_says_so(mobilenet_bundle: Path) -> None:
    runner = DeviceRunner(Bundle.load(mobilenet_bundle), threads=1)
    with pytest.raises(BundleError, match=rf"split {TEST_SPLITS[0]} has no cut coding 'k4' \(it has: none\); rebuild"):
        runner.payload(f"{TEST_SPLITS[0]}@k4", np.zeros((1, 32, 28, 28), np.float32))
    with pytest.raises(BundleError, match=rf"split {TEST_SPLITS[0]} has no cut coding 'k4'"):
        runner.run_head(f"{TEST_SPLITS[0]}@k4", np.zeros((1, 3, 224, 224), np.float32))


def test_a_forged_top_level_coding_is_not_taken_from_the_wire(coded_host: RunningHost, coded: Bundle,
                                                              photo_batch: np.ndarray) -> None:
    """Only the tensor's own fields say it is coded: a ``coding`` beside the tensor is dropped, so a
    float32 cut with one is answered as the float32 cut it is."""
    cut = OnnxBackend(coded.artifact(TEST_SPLITS[1], HEAD)).run(photo_batch[:1])
    with raw_connection(coded_host) as sock:
        sock.sendall(encode_bytes({"op": "infer", "id": 3, "bundle": coded.id, "split": TEST_SPLITS[1],
                                   "coding": {"name": "k2"}}, cut))
        reply = read_reply(sock)
    expected = OnnxBackend(coded.artifact(TEST_SPLITS[1], TAIL)).run(cut)
    assert reply["ok"] is True and np.allclose(reply["tensor"], expected, atol=1e-5)


def test_the_host_offers_each_coded_option_and_times_its_decode_with_its_tail(coded_host: RunningHost,
                                                                                coded: Bundle) -> None:
    """``hello`` lists ``SPLIT@k4`` beside the split (a board offers what its host decodes), and
    ``profile`` times it as the host runs it: unpacking and dequantizing, then the tail. An infer
    still names the split (the coding is the tensor's): one naming the option is refused."""
    options = [f"{split}@k{bits}" for split in TEST_SPLITS for bits in TEST_CODINGS]

    async def go():
        client = await HostClient.connect(coded_host.host, coded_host.port)
        try:
            served = client.server_info["bundles"][coded.id]
            times = await client.profile(coded.id, [1, 2], repeats=3, splits=[TEST_SPLITS[1], f"{TEST_SPLITS[1]}@k2"])
            with pytest.raises(RemoteError, match=rf"split '{TEST_SPLITS[0]}@k4' of bundle .* has no tail here"):
                await client.infer(coded.id, f"{TEST_SPLITS[0]}@k4",
                                   np.zeros((1, *coded.manifest.split(TEST_SPLITS[0]).tensor.shape), np.float32))
            return served, times
        finally:
            await client.close()

    served, times = asyncio.run(go())
    assert set(options) <= set(served)
    assert set(times) == {TEST_SPLITS[1], f"{TEST_SPLITS[1]}@k2"}
    assert all(set(t) == {1, 2} and min(t.values()) > 0 for t in times.values())
