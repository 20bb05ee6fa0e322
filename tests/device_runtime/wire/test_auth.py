"""Per-frame HMAC, sans-IO: the handshake, the layout of docs/protocol.md, and every refusal.

Host and device sides talk to each other in memory here; tests/host_runtime/test_auth.py does
the same against a real host over TCP.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from pathlib import Path

import numpy as np
import pytest

from device_runtime.wire._auth import (
    ENVELOPE,
    LABEL,
    MARK,
    DeviceAuth,
    FrameAuth,
    HostAuth,
    load_key,
)
from device_runtime.wire._protocol import FrameDecoder, Oversized, decode, encode, error_reply
from splitedge.errors import CredentialsError, FrameRefused

KEY = b"0123456789abcdef0123456789abcdef"


def wire(auth: FrameAuth, message: dict, tensor: np.ndarray | None = None, **fields) -> bytes:
    """One frame as it goes on the socket."""
    return b"".join(bytes(b) for b in auth.seal(encode(message, tensor, **fields)))


def bodies(data: bytes, max_frame_bytes: int = 1 << 26) -> list:
    return list(FrameDecoder(max_frame_bytes).feed(data))


def receive(auth: FrameAuth, data: bytes) -> dict | None:
    (body,) = bodies(data)
    content = auth.open(body)
    return None if content is None else decode(content)


def session(host_key: bytes = KEY, device_key: bytes = KEY) -> tuple[HostAuth, DeviceAuth, bytes]:
    """A completed handshake; returns both sides and the device's auth frame as sent."""
    host, device = HostAuth(host_key), DeviceAuth(device_key)
    assert receive(device, wire(host, host.greeting())) is None  # the challenge goes out plain
    auth_frame = wire(device, device.auth_message())
    assert receive(host, auth_frame) is None  # consumed by the auth layer, never seen by the server
    assert host.established and device.established
    return host, device, auth_frame


def test_both_directions_round_trip_with_a_tensor() -> None:
    host, device, _ = session()
    cut = np.random.default_rng(0).standard_normal((2, 16, 7, 7)).astype(np.float32)
    request = receive(host, wire(device, {"op": "infer", "id": 1, "bundle": "b", "split": "s"}, cut))
    assert request["id"] == 1
    np.testing.assert_array_equal(request["tensor"], cut)
    q = np.arange(12, dtype=np.uint8)
    reply = receive(device, wire(host, {"id": 1, "ok": True}, q, scale=0.5, zero_point=3))
    assert reply["quantization"] == {"scale": 0.5, "zero_point": 3}
    np.testing.assert_array_equal(reply["tensor"], q)


def test_layout_and_tag_are_those_of_the_protocol_document() -> None:
    """0xC1 | counter u64 BE | HMAC-SHA256(key, LABEL || sender || nonces || counter || map) | map."""
    host, device, auth_frame = session()
    (length,) = struct.unpack(">I", auth_frame[:4])
    assert length == len(auth_frame) - 4
    mark, counter, tag = ENVELOPE.unpack_from(auth_frame, 4)
    content = auth_frame[4 + ENVELOPE.size :]
    assert (mark, counter, ENVELOPE.size) == (MARK, 1, 41)
    expected = hmac.new(KEY, LABEL + b"D" + host.nonce + counter.to_bytes(8, "big") + content, hashlib.sha256)
    assert tag == expected.digest()
    assert decode(content) == {"op": "auth", "nonce": device.nonce}

    reply = wire(host, {"id": 1, "ok": True})
    mark, counter, tag = ENVELOPE.unpack_from(reply, 4)
    content = reply[4 + ENVELOPE.size :]
    context = LABEL + b"H" + host.nonce + device.nonce
    assert counter == 1 and tag == hmac.new(KEY, context + counter.to_bytes(8, "big") + content, hashlib.sha256).digest()


def test_sealing_keeps_the_tensor_a_view_of_the_array() -> None:
    _, device, _ = session()
    array = np.ones((1, 1280, 7, 7), dtype=np.float32)
    buffers = encode({"op": "infer", "id": 2}, array)
    sealed = device.seal(buffers)
    assert sealed[1] is buffers[1]  # the same memoryview: HMAC read it, nobody copied it
    assert np.shares_memory(np.frombuffer(sealed[1], dtype=np.float32), array)
    assert len(sealed[0]) == len(buffers[0]) + ENVELOPE.size


def test_oversized_frame_is_refused_from_its_prefix_and_the_counters_stay_in_step() -> None:
    host, device, _ = session()
    big = wire(device, {"op": "ping", "id": 1}, np.zeros(10_000, np.uint8))
    small = wire(device, {"op": "ping", "id": 2})
    decoder = FrameDecoder(max_frame_bytes=4096)
    events = list(decoder.feed(big[:4]))  # only the length prefix: refused before the body arrives
    assert isinstance(events[0], Oversized) and events[0].length == len(big) - 4
    host.skipped()
    (body,) = list(decoder.feed(big[4:] + small))
    assert decode(host.open(body))["id"] == 2


@pytest.mark.parametrize(
    "where", ["mark", "counter", "tag", "map", "last tensor byte"],
)
def test_any_changed_byte_is_refused(where: str) -> None:
    host, device, _ = session()
    frame = bytearray(wire(device, {"op": "infer", "id": 3}, np.arange(64, dtype=np.float32)))
    offset = {"mark": 4, "counter": 5 + 7, "tag": 13 + 5, "map": 4 + ENVELOPE.size + 2, "last tensor byte": len(frame) - 1}
    frame[offset[where]] ^= 0x01
    with pytest.raises(FrameRefused, match="authentication failed|requires authenticated frames") as info:
        receive(host, bytes(frame))
    assert info.value.code == "unauthorized"
    assert info.value.kind == ("unauthenticated" if where == "mark" else "bad_mac")


def test_a_frame_replayed_on_its_own_connection_is_refused() -> None:
    host, device, _ = session()
    frame = wire(device, {"op": "ping", "id": 4})
    assert receive(host, frame)["id"] == 4
    with pytest.raises(FrameRefused) as info:
        receive(host, frame)
    assert info.value.kind == "replayed" and "counter 2, expected 3" in info.value.reason


def test_frames_recorded_on_another_connection_are_refused_both_ways() -> None:
    host1, device1, auth_frame1 = session()
    request1 = wire(device1, {"op": "ping", "id": 5})
    reply1 = wire(host1, {"id": 5, "ok": True})
    host2, device2, _ = session()  # fresh nonces on both sides; the counters are where they were on 1
    with pytest.raises(FrameRefused, match="authentication failed"):
        receive(host2, request1)
    with pytest.raises(FrameRefused):
        receive(device2, reply1)
    # A recorded handshake does not open a new connection either.
    with pytest.raises(FrameRefused) as info:
        receive(HostAuth(KEY), auth_frame1)
    assert info.value.kind == "bad_mac"


def test_a_fake_host_replaying_an_old_challenge_and_replies_is_refused() -> None:
    """The device binds what it accepts to its own nonce: an old host nonce does not make old replies fresh."""
    host1, _, _ = session()
    recorded_challenge = b"".join(encode(host1.greeting()))  # plain: anyone can record it
    recorded_reply = wire(host1, {"id": 1, "ok": True, "bundles": {}})
    device = DeviceAuth(KEY)
    assert receive(device, recorded_challenge) is None
    with pytest.raises(FrameRefused) as info:
        receive(device, recorded_reply)
    assert info.value.kind == "bad_mac"


def test_a_frame_reflected_back_to_its_sender_is_refused() -> None:
    host, device, _ = session()
    frame = wire(device, {"op": "ping", "id": 6})
    with pytest.raises(FrameRefused):
        receive(device, frame)


def test_a_wrong_key_fails_at_the_first_frame() -> None:
    host, device = HostAuth(KEY), DeviceAuth(b"another key of 32 bytes, not it!")
    receive(device, wire(host, host.greeting()))
    with pytest.raises(FrameRefused) as info:
        receive(host, wire(device, device.auth_message()))
    assert str(info.value) == "authentication failed" and info.value.kind == "bad_mac"


def test_host_refuses_plain_frames_and_a_first_frame_that_is_not_auth() -> None:
    host, device = HostAuth(KEY), DeviceAuth(KEY)
    with pytest.raises(FrameRefused, match="requires authenticated frames") as info:
        receive(host, b"".join(encode({"op": "hello", "id": 1, "protocol": 1})))
    assert info.value.kind == "unauthenticated"
    receive(device, wire(host, host.greeting()))
    with pytest.raises(FrameRefused) as info:
        receive(host, wire(device, {"op": "hello", "id": 1, "protocol": 1}))
    assert info.value.kind == "handshake"


def test_device_accepts_only_the_challenge_and_a_refusal_in_plain() -> None:
    _, device, _ = session()
    with pytest.raises(FrameRefused) as info:
        receive(device, b"".join(encode({"id": 1, "ok": True, "bundles": {}})))  # a forged plain reply
    assert info.value.kind == "unauthenticated"
    with pytest.raises(FrameRefused, match="refused this device: authentication failed") as info:
        receive(device, b"".join(encode(error_reply(None, "unauthorized", "authentication failed"))))
    assert info.value.kind == "refused_by_host"


def write_key(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def test_load_key(tmp_path: Path) -> None:
    assert load_key(write_key(tmp_path / "k", KEY.hex().encode() + b"\n")) == KEY.hex().encode()
    assert load_key(write_key(tmp_path / "g", KEY, 0o640)) == KEY  # group-readable is the admin's call


@pytest.mark.parametrize(
    "data, mode, message",
    [
        (b"", 0o600, "is empty"),
        (b" \n", 0o600, "is empty"),
        (b"short-key", 0o600, "holds 9 bytes, too short: at least 16"),
        (KEY, 0o644, "is readable by every user (mode 644)"),
    ],
)
def test_unusable_key_files_are_refused_with_the_reason(tmp_path: Path, data: bytes, mode: int, message: str) -> None:
    path = write_key(tmp_path / "key", data, mode)
    with pytest.raises(CredentialsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_key(path)


def test_missing_key_file(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="No such file"):
        load_key(tmp_path / "nope")
