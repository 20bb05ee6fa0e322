"""A live host on 127.0.0.1: correct results, replies matched by id, typed errors, and it keeps serving."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from typing import Iterator

import msgpack
import numpy as np
import pytest

from device_runtime.bundle import LOCAL, Bundle
from device_runtime.engine._backend import OnnxBackend
from device_runtime.link import HostClient
from device_runtime.wire._protocol import decode, encode_bytes
from splitedge.errors import RemoteError
from tests.conftest import TEST_CHAIN, TEST_SPLITS, RunningHost, start_host

ATOL = 1e-4  # head → wire → tail against the full model, float32 end to end


def raw_connection(host: RunningHost) -> socket.socket:
    sock = socket.create_connection((host.host, host.port), timeout=10)
    return sock


def read_reply(sock: socket.socket) -> dict:
    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "host closed the connection"
            data += chunk
        return data

    (length,) = struct.unpack(">I", exactly(4))
    return decode(exactly(length))


def cut_tensor(bundle: Bundle, split_id: str, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A head output for random inputs and the full model's logits for the same inputs."""
    x = np.random.default_rng(seed).standard_normal((batch, *bundle.manifest.model.input_shape), dtype=np.float32)
    head = OnnxBackend(bundle.artifact(split_id, "head"))
    full = OnnxBackend(bundle.artifact(LOCAL, "full"))
    return head.run(x), full.run(x)


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


@pytest.fixture(params=["asyncio", "uvloop"])
def host(request: pytest.FixtureRequest, mobilenet_bundle) -> Iterator[RunningHost]:
    """Every test here runs on asyncio's event loop and on uvloop's (``split-host serve --loop auto``
    takes uvloop where the host extra installed it)."""
    new_loop = asyncio.new_event_loop if request.param == "asyncio" else pytest.importorskip("uvloop").new_event_loop
    yield from start_host([mobilenet_bundle], new_loop=new_loop)


def test_hello_lists_bundles_and_splits(host: RunningHost, bundle: Bundle) -> None:
    async def go():
        client = await HostClient.connect(host.host, host.port)
        await client.close()
        return client.server_info

    info = asyncio.run(go())
    assert info["protocol"] == 1 and info["auth"] is False
    # offload: the full model; the chain's two stages as tails of their own
    assert sorted(info["bundles"][bundle.id]) == sorted([*TEST_SPLITS, "offload", f"{TEST_CHAIN}#1", f"{TEST_CHAIN}#2"])


@pytest.mark.parametrize("split_id", TEST_SPLITS)
@pytest.mark.parametrize("batch", [1, 3])
def test_infer_reproduces_the_full_model(host: RunningHost, bundle: Bundle, split_id: str, batch: int) -> None:
    cut, expected = cut_tensor(bundle, split_id, batch)

    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            return await client.infer(bundle.id, split_id, cut)
        finally:
            await client.close()

    result = asyncio.run(go())
    assert result.output.shape == expected.shape
    np.testing.assert_allclose(result.output, expected, atol=ATOL, rtol=0)
    assert 0 < result.compute_ms < result.round_trip_ms


def test_many_requests_in_flight_are_matched_by_id(host: RunningHost, bundle: Bundle) -> None:
    """Eight concurrent requests on one connection, mixed splits: each gets its own answer."""
    cases = [cut_tensor(bundle, TEST_SPLITS[i % 2], 1, seed=i) + (TEST_SPLITS[i % 2],) for i in range(8)]

    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            return await asyncio.gather(*(client.infer(bundle.id, s, cut) for cut, _, s in cases))
        finally:
            await client.close()

    for result, (_, expected, _) in zip(asyncio.run(go()), cases):
        np.testing.assert_allclose(result.output, expected, atol=ATOL, rtol=0)


def test_pipelined_raw_frames_get_every_reply(host: RunningHost, bundle: Bundle) -> None:
    """Frames written back to back in one send; replies may come in any order, ids say which is which."""
    cut, expected = cut_tensor(bundle, TEST_SPLITS[1], 1)
    frames = b"".join(
        encode_bytes({"op": "infer", "id": i, "bundle": bundle.id, "split": TEST_SPLITS[1]}, cut * (1 + i % 2))
        for i in range(6)
    )
    with raw_connection(host) as sock:
        sock.sendall(frames)
        replies = {r["id"]: r for r in (read_reply(sock) for _ in range(6))}
    assert sorted(replies) == list(range(6))
    np.testing.assert_allclose(replies[0]["tensor"], expected, atol=ATOL, rtol=0)
    np.testing.assert_allclose(replies[2]["tensor"], expected, atol=ATOL, rtol=0)
    assert not np.allclose(replies[1]["tensor"], expected, atol=ATOL)  # a different input, a different answer


def bad_frames(bundle: Bundle) -> list[tuple[str, bytes, str, str]]:
    split = TEST_SPLITS[1]
    shape = [1, *bundle.manifest.split(split).tensor.shape]
    good = np.zeros(shape, dtype=np.float32)

    def infer(i: int, tensor: np.ndarray, **fields) -> bytes:
        return encode_bytes({"op": "infer", "id": i, "bundle": bundle.id, "split": split, **fields}, tensor)

    body = msgpack.packb({"op": "infer", "id": 6, "bundle": bundle.id, "split": split,
                          "tensor": {"dtype": "float32", "shape": shape, "data": b"\x00" * 10}}, use_bin_type=True)
    return [
        ("malformed msgpack", struct.pack(">I", 3) + b"\xc1\xc1\xc1", "bad_request", "malformed msgpack"),
        ("wrong dtype", infer(2, good.astype(np.uint8)), "bad_request", "takes float32, got uint8"),
        ("wrong shape", infer(3, np.zeros((1, 3, 7, 7), np.float32)), "bad_request", "takes shape [batch, 160, 7, 7]"),
        ("unknown bundle", infer(4, good, bundle="nope"), "unknown_bundle", "bundle 'nope' is not served"),
        ("unknown split", infer(5, good, split="features_99"), "unknown_split", "split 'features_99'"),
        ("short tensor data", struct.pack(">I", len(body)) + body, "bad_request", "needs 31360 bytes, frame carries 10"),
        ("unknown op", encode_bytes({"op": "reboot", "id": 7}), "bad_request", "unknown op 'reboot'"),
        ("infer without tensor", encode_bytes({"op": "infer", "id": 8, "bundle": bundle.id, "split": split}),
         "bad_request", "infer needs a tensor"),
    ]


def test_bad_frames_get_typed_errors_and_the_connection_goes_on(host: RunningHost, bundle: Bundle) -> None:
    with raw_connection(host) as sock:
        for what, frame, code, message in bad_frames(bundle):
            sock.sendall(frame)
            reply = read_reply(sock)
            assert reply["ok"] is False, what
            assert reply["error"]["code"] == code, what
            assert message in reply["error"]["message"], (what, reply["error"]["message"])
            sock.sendall(encode_bytes({"op": "ping", "id": 100}))  # the same connection still serves
            assert read_reply(sock) == {"id": 100, "ok": True, "bytes": 0}, what
    errors = host.call(lambda: _stats(host))["errors"]
    assert errors["bad_request"] >= 6 and errors["unknown_bundle"] == 1 and errors["unknown_split"] == 1


async def _stats(host: RunningHost) -> dict:
    return host.server.stats.as_dict()


def test_error_ids_are_kept_where_the_map_parsed(host: RunningHost, bundle: Bundle) -> None:
    frames = {what: frame for what, frame, _, _ in bad_frames(bundle)}
    with raw_connection(host) as sock:
        sock.sendall(frames["short tensor data"])
        assert read_reply(sock)["id"] == 6
        sock.sendall(frames["malformed msgpack"])
        assert read_reply(sock)["id"] is None


def test_oversized_frame_is_refused_before_it_is_read(mobilenet_bundle, bundle: Bundle) -> None:
    for host in start_host([mobilenet_bundle], max_frame_bytes=4096):
        with raw_connection(host) as sock:
            # Only the length prefix is sent: the refusal cannot depend on reading the body.
            sock.sendall(struct.pack(">I", 10_000_000))
            reply = read_reply(sock)
            assert reply["error"]["code"] == "bad_request"
            assert "frame of 10000000 bytes exceeds the limit of 4096 bytes" in reply["error"]["message"]


def test_oversized_body_is_skipped_and_the_connection_goes_on(mobilenet_bundle) -> None:
    for host in start_host([mobilenet_bundle], max_frame_bytes=4096):
        with raw_connection(host) as sock:
            sock.sendall(encode_bytes({"op": "ping", "id": 1}, np.zeros(10_000, np.uint8)))
            assert read_reply(sock)["error"]["code"] == "bad_request"
            sock.sendall(encode_bytes({"op": "ping", "id": 2}, np.zeros(100, np.uint8)))
            assert read_reply(sock) == {"id": 2, "ok": True, "bytes": 100}


def test_truncated_frame_and_garbage_do_not_disturb_other_connections(host: RunningHost, bundle: Bundle) -> None:
    cut, expected = cut_tensor(bundle, TEST_SPLITS[0], 1)
    frame = encode_bytes({"op": "infer", "id": 1, "bundle": bundle.id, "split": TEST_SPLITS[0]}, cut)

    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            truncated = raw_connection(host)
            truncated.sendall(frame[: len(frame) // 2])
            truncated.close()  # the peer vanishes mid-frame
            garbage = raw_connection(host)
            garbage.sendall(b"\x00\x00\x00\x05hello" * 50)
            results = await asyncio.gather(*(client.infer(bundle.id, TEST_SPLITS[0], cut) for _ in range(4)))
            garbage.close()
            return results
        finally:
            await client.close()

    for result in asyncio.run(go()):
        np.testing.assert_allclose(result.output, expected, atol=ATOL, rtol=0)
    with raw_connection(host) as sock:  # and new connections are still accepted
        sock.sendall(frame)
        np.testing.assert_allclose(read_reply(sock)["tensor"], expected, atol=ATOL, rtol=0)


def test_client_raises_the_typed_error(host: RunningHost, bundle: Bundle) -> None:
    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            await client.infer(bundle.id, "nope", np.zeros((1, 4), np.float32))
        finally:
            await client.close()

    with pytest.raises(RemoteError, match="unknown_split") as info:
        asyncio.run(go())
    assert info.value.code == "unknown_split"


def test_hello_refuses_another_protocol_version(host: RunningHost) -> None:
    with raw_connection(host) as sock:
        sock.sendall(encode_bytes({"op": "hello", "id": 1, "protocol": 99}))
        reply = read_reply(sock)
    assert reply["error"]["code"] == "bad_request"
    assert "protocol version 99 is not spoken here; this host speaks 1" in reply["error"]["message"]


def test_stats_count_requests_and_tail_times(host: RunningHost, bundle: Bundle) -> None:
    cut, _ = cut_tensor(bundle, TEST_SPLITS[1], 1)

    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            for _ in range(3):
                await client.infer(bundle.id, TEST_SPLITS[1], cut)
            return await client.stats()
        finally:
            await client.close()

    stats = asyncio.run(go())["stats"]
    assert stats["requests"]["infer"] == 3 and stats["requests"]["hello"] == 1
    assert stats["connections"] == 1 and stats["in_flight"] == 0
    assert stats["tail_ms_mean"][f"{bundle.id}/{TEST_SPLITS[1]}"] > 0


def test_frame_in_small_segments_costs_few_reads(host: RunningHost, monkeypatch) -> None:
    """SO_RCVLOWAT: a 250 KB frame trickling in as 1460-byte segments wakes the host a few
    times, not once per segment (172 reads without it, measured)."""
    from device_runtime.wire._connection import FramedProtocol

    reads = []
    original = FramedProtocol.buffer_updated
    monkeypatch.setattr(FramedProtocol, "buffer_updated", lambda self, n: (reads.append(n), original(self, n))[1])
    frame = encode_bytes({"op": "ping", "id": 1}, np.zeros(250_000, np.uint8))
    with raw_connection(host) as sock:
        for start in range(0, len(frame), 1460):
            sock.sendall(frame[start : start + 1460])
            time.sleep(0.0002)
        assert read_reply(sock) == {"id": 1, "ok": True, "bytes": 250_000}
    assert sum(reads) == len(frame)
    assert len(reads) <= 10


def test_uint8_transmission_is_dequantized_before_the_tail(host: RunningHost, bundle: Bundle) -> None:
    """The board sends the cut as uint8 with scale and zero point; the host's answer matches
    the float32 one within what 8 bits can say, and top-1 is unchanged."""
    from device_runtime.wire._quantization import affine_params, quantize

    cut, expected = cut_tensor(bundle, TEST_SPLITS[1], 3)
    scale, zero_point = affine_params(cut.min(), cut.max())
    q = quantize(cut, scale, zero_point)
    assert q.nbytes * 4 == cut.nbytes

    async def go():
        client = await HostClient.connect(host.host, host.port)
        try:
            return await client.infer(bundle.id, TEST_SPLITS[1], q, scale=scale, zero_point=zero_point)
        finally:
            await client.close()

    result = asyncio.run(go())
    assert result.output.dtype == np.float32 and result.output.shape == expected.shape
    assert (result.output.argmax(1) == expected.argmax(1)).all()
    cosine = (result.output * expected).sum(1) / np.linalg.norm(result.output, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() > 0.99


def test_uint8_is_dequantized_on_a_worker_not_the_event_loop(host: RunningHost, bundle: Bundle, monkeypatch) -> None:
    """A 9.6 MB uint8 frame dequantized on the loop held every other connection's ping 78-160 ms
    (issue 45): it is dequantized where the tail runs, and a wrong shape is still refused at once."""
    import threading

    import host_runtime._batcher as batcher
    from device_runtime.wire._quantization import affine_params, quantize

    threads = []
    original = batcher.dequantize
    monkeypatch.setattr(batcher, "dequantize", lambda *a, **k: (threads.append(threading.current_thread()), original(*a, **k))[1])
    cut, expected = cut_tensor(bundle, TEST_SPLITS[1], 2)
    scale, zero_point = affine_params(cut.min(), cut.max())

    async def go(tensor: np.ndarray):
        client = await HostClient.connect(host.host, host.port)
        try:
            return await client.infer(bundle.id, TEST_SPLITS[1], tensor, scale=scale, zero_point=zero_point)
        finally:
            await client.close()

    result = asyncio.run(go(quantize(cut, scale, zero_point)))
    assert (result.output.argmax(1) == expected.argmax(1)).all()
    assert threads and all(t.name != "test-host" for t in threads)  # start_host's loop runs in "test-host"
    with pytest.raises(RemoteError, match=r"takes shape .*got \[2, 1\]"):
        asyncio.run(go(np.zeros((2, 1), np.uint8)))


def test_quantized_tensor_must_be_uint8(host: RunningHost, bundle: Bundle) -> None:
    cut, _ = cut_tensor(bundle, TEST_SPLITS[1], 1)
    with raw_connection(host) as sock:
        sock.sendall(encode_bytes({"op": "infer", "id": 5, "bundle": bundle.id, "split": TEST_SPLITS[1]},
                                  cut, scale=0.1, zero_point=3))
        reply = read_reply(sock)
    assert reply["error"]["code"] == "bad_request" and "must be uint8, got float32" in reply["error"]["message"]
