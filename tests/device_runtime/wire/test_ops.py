"""The typed ops: one builder and one parser per message, frames byte for byte what they were.

``LEGACY`` holds each message as the device and the host built it by hand before the typed
ops existed (dict literals in the client and the server): the builders must produce exactly
those bytes, so a board and a host of either vintage still talk.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from device_runtime.wire.ops import (
    ERROR_CODES,
    OPS,
    PROTOCOL_VERSION,
    REPLIES,
    REQUESTS,
    ErrorReply,
    HelloReply,
    HelloRequest,
    Hop,
    HopTiming,
    InferReply,
    InferRequest,
    LinksReply,
    LinksRequest,
    Message,
    PingReply,
    PingRequest,
    ProfileReply,
    ProfileRequest,
    Quantization,
    StatsReply,
    StatsRequest,
    error_reply,
    parse_reply,
    parse_request,
)
from device_runtime.wire._protocol import FrameDecoder, decode, encode_bytes, encode_message
from splitedge.errors import ProtocolError

CUT = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
Q = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
PAYLOAD = np.zeros(100, dtype=np.uint8)
BUNDLES = {"b1": ["features.6", "offload"]}

#: (typed message, the map, tensor and tensor fields the hand-written code sent for it)
LEGACY: list[tuple[Message, dict[str, Any], np.ndarray | None, dict[str, Any]]] = [
    (HelloRequest(1), {"op": "hello", "protocol": PROTOCOL_VERSION, "id": 1}, None, {}),
    (InferRequest(2, "b1", "features.6", CUT, 10000.0),
     {"op": "infer", "bundle": "b1", "split": "features.6", "deadline_ms": 10000.0, "id": 2}, CUT, {}),
    (InferRequest(3, "b1", "features.6", Q, 2500.0, Quantization(0.05, 128)),
     {"op": "infer", "bundle": "b1", "split": "features.6", "deadline_ms": 2500.0, "id": 3}, Q,
     {"scale": 0.05, "zero_point": 128}),
    (InferRequest(9, "b1", "features.6", CUT, 40.0, alternative="local", alternative_ms=300.0),
     {"op": "infer", "bundle": "b1", "split": "features.6", "deadline_ms": 40.0, "alternative_ms": 300.0,
      "alternative": "local", "id": 9}, CUT, {}),
    (PingRequest(4), {"op": "ping", "id": 4}, None, {}),
    (PingRequest(5, PAYLOAD), {"op": "ping", "id": 5}, PAYLOAD, {}),
    (StatsRequest(6), {"op": "stats", "id": 6}, None, {}),
    (ProfileRequest(7, "b1", (1, 8), 10), {"op": "profile", "bundle": "b1", "batches": [1, 8], "repeats": 10, "id": 7},
     None, {}),
    (ProfileRequest(8, "b1", (4,), 3, ("features.6",)),
     {"op": "profile", "bundle": "b1", "batches": [4], "repeats": 3, "splits": ["features.6"], "id": 8}, None, {}),
    (HelloReply(1, PROTOCOL_VERSION, BUNDLES, False, 64 << 20, "cpu"),
     {"id": 1, "ok": True, "protocol": PROTOCOL_VERSION, "bundles": BUNDLES, "auth": False,
      "max_frame_bytes": 64 << 20, "device": "cpu"}, None, {}),
    (InferReply(2, CUT, 3.25, 0.5, 2), {"id": 2, "ok": True, "compute_ms": 3.25, "queue_ms": 0.5, "batch": 2}, CUT, {}),
    (PingReply(5, 100), {"id": 5, "ok": True, "bytes": 100}, None, {}),
    (StatsReply(6, {"requests": {"ping": 3}}), {"id": 6, "ok": True, "stats": {"requests": {"ping": 3}}}, None, {}),
    (ProfileReply(7, {"features.6": {1: 2.5, 8: 9.0}}),
     {"id": 7, "ok": True, "tail_ms": {"features.6": {"1": 2.5, "8": 9.0}}}, None, {}),
    (ErrorReply("r9", "overloaded", "queue full"),
     {"id": "r9", "ok": False, "error": {"code": "overloaded", "message": "queue full"}}, None, {}),
]
IDS = [type(m).__name__ + str(i) for i, (m, *_) in enumerate(LEGACY)]


def decoded(message: Message) -> dict[str, Any]:
    (body,) = FrameDecoder().feed(b"".join(bytes(b) for b in encode_message(message)))
    return decode(body)


def same(a: Message, b: Message) -> None:
    """Dataclass equality, arrays compared by value (``==`` on a dataclass holding arrays is ambiguous)."""
    assert type(a) is type(b)
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y, name


@pytest.mark.parametrize(("message", "legacy", "tensor", "fields"), LEGACY, ids=IDS)
def test_frames_are_byte_for_byte_the_hand_built_ones(message: Message, legacy: dict, tensor, fields) -> None:
    assert b"".join(bytes(b) for b in encode_message(message)) == encode_bytes(legacy, tensor, **fields)


@pytest.mark.parametrize(("message", "legacy", "tensor", "fields"), LEGACY, ids=IDS)
def test_every_message_parses_back_to_itself(message: Message, legacy: dict, tensor, fields) -> None:
    wire = decoded(message)
    parsed = parse_request(wire) if "op" in wire else parse_reply(REPLY_OPS[type(message)], wire)
    same(parsed, message)


REPLY_OPS = {reply_type: op for op, reply_type in REPLIES.items()} | {ErrorReply: "infer"}


def test_the_tables_cover_every_op_once() -> None:
    assert OPS == ("hello", "infer", "ping", "stats", "profile", "links")
    assert tuple(REQUESTS) == tuple(REPLIES) == OPS
    assert all(request_type.op == op for op, request_type in REQUESTS.items())


def test_the_tensor_stays_last_and_unjoined() -> None:
    """The typed builder keeps encode's layout: a small prefix, then the array's own memory."""
    prefix, data = encode_message(InferRequest(1, "b1", "features.6", CUT, 10.0))
    assert isinstance(data, memoryview) and np.shares_memory(np.frombuffer(data, np.float32), CUT)
    assert len(prefix) < 128  # only the header is built in Python


# -- requests: every field checked, the error naming it and carrying the id -------------------------


def infer_map(**changes: Any) -> dict[str, Any]:
    message = {"op": "infer", "id": 42, "bundle": "b1", "split": "features.6", "tensor": CUT}
    message.update(changes)
    return {k: v for k, v in message.items() if v is not MISSING}


MISSING = object()
HOP2 = {"address": "10.0.0.9:7767", "split": "a+b", "stage": 2}


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (infer_map(op="INFER"), "unknown op 'INFER'; ops: hello, infer, ping, stats, profile, links$"),
        (infer_map(op=["infer"]), "unknown op"),  # unhashable: no TypeError from the table lookup
        (infer_map(op=MISSING), "unknown op None"),
        (infer_map(bundle=7), "infer.bundle: expected a string, got 7"),
        (infer_map(bundle=MISSING), "infer.bundle"),
        (infer_map(split=[1]), "infer.split"),
        (infer_map(tensor=MISSING), "infer.tensor: infer needs a tensor map, got nothing"),
        (infer_map(deadline_ms="soon"), "infer.deadline_ms must be a number of milliseconds"),
        (infer_map(deadline_ms=True), "infer.deadline_ms"),
        (infer_map(deadline_ms=math.nan), "infer.deadline_ms"),
        (infer_map(quantization={"scale": 0.1, "zero_point": 0}), "a quantized tensor must be uint8, got float32"),
        ({"op": "hello", "id": 42, "protocol": 2}, "hello.protocol: protocol version 2 is not spoken here; this host speaks 1"),
        ({"op": "hello", "id": 42, "protocol": True}, "hello.protocol"),
        ({"op": "hello", "id": 42}, "hello.protocol: protocol version None"),
        ({"op": "ping", "id": 42, "tensor": "x"}, "ping.tensor"),
        ({"op": "profile", "id": 42, "bundle": "b1", "batches": []}, "profile.batches: expected a non-empty list"),
        ({"op": "profile", "id": 42, "bundle": "b1", "batches": 4}, "profile.batches"),
        ({"op": "profile", "id": 42, "bundle": "b1", "batches": [1, 65]}, r"profile.batches\[1\]: .* in 1..64, got 65"),
        ({"op": "profile", "id": 42, "bundle": "b1", "batches": [True]}, r"profile.batches\[0\]"),
        ({"op": "profile", "id": 42, "bundle": "b1", "batches": [1], "repeats": 0}, "profile.repeats: .* 1..50"),
        ({"op": "profile", "id": 42, "bundle": "b1", "batches": [1], "repeats": 2.0}, "profile.repeats"),
        ({"op": "profile", "id": 42, "bundle": "b1", "batches": [1], "splits": "features.6"}, "profile.splits"),
        ({"op": "profile", "id": 42, "bundle": None, "batches": [1]}, "profile.bundle"),
        # A chain's route: bounded, each hop the next stage (so no loop, no skip), at a host:port.
        (infer_map(route=[HOP2]), "infer.route: a route is only for a chain's stage"),
        (infer_map(stage=0), r"infer.stage: .* 1..9, got 0"),
        (infer_map(stage=1, route=[dict(HOP2, stage=k + 2) for k in range(9)]), "infer.route: .* at most 8 hops"),
        (infer_map(stage=1, route=[HOP2, dict(HOP2, stage=2)]), r"infer.route\[1\].stage: expected 3 .*, got 2"),
        (infer_map(stage=2, route=[dict(HOP2, stage=1)]), r"infer.route\[0\].stage: expected 3 .*, got 1"),
        (infer_map(stage=1, route=[dict(HOP2, stage=True)]), r"infer.route\[0\].stage"),
        (infer_map(stage=1, route=[dict(HOP2, address="10.0.0.9")]), r"infer.route\[0\].address: '10.0.0.9' is not host:port"),
        (infer_map(stage=1, route=[dict(HOP2, address="h:99999")]), r"infer.route\[0\].address"),
        (infer_map(stage=1, route=[dict(HOP2, address="a" * 300 + ":1")]), r"longer than 255 characters"),
        (infer_map(stage=1, route=["10.0.0.9:7767"]), r"infer.route\[0\]: expected an object"),
        (infer_map(stage=1, route={"0": HOP2}), "infer.route: expected a list"),
        ({"op": "links", "id": 42, "peers": []}, r"links.peers: expected a list of 1..8 addresses"),
        ({"op": "links", "id": 42, "peers": ["a:1"] * 9}, r"links.peers: expected a list of 1..8 addresses"),
        ({"op": "links", "id": 42, "peers": ["a"]}, r"links.peers\[0\]: 'a' is not host:port"),
        ({"op": "links", "id": 42, "peers": ["a:1"], "bytes": 5 * 2**20}, r"links.bytes: .* 1..4194304"),
    ],
)
def test_bad_requests_name_the_field_and_keep_the_id(message: dict, match: str) -> None:
    with pytest.raises(ProtocolError, match=match) as info:
        parse_request(message)
    assert info.value.code == "bad_request" and info.value.request_id == 42


@pytest.mark.parametrize("budget", [-5, 0, 0.0, -0.0, -1e300, -math.inf, 2**64 - 1, 60_000])
def test_any_number_is_a_deadline_a_spent_one_included(budget: float) -> None:
    """A budget of zero or less is the host's to answer ``deadline_exceeded``, not a malformed field,
    and never "none": 0 on the wire is a budget already spent."""
    assert parse_request(infer_map(deadline_ms=budget)).deadline_ms == float(budget)


def test_no_deadline_is_none_at_the_wire_edge() -> None:
    """Absent or infinite on the wire is None in the code; None is sent as no field at all."""
    assert parse_request(infer_map(deadline_ms=math.inf)).deadline_ms is None
    assert parse_request(infer_map()).deadline_ms is None
    message, _, _ = InferRequest(7, "b1", "features.6", np.zeros((1, 2), np.float32), None).parts()
    assert "deadline_ms" not in message
    message, _, _ = InferRequest(7, "b1", "features.6", np.zeros((1, 2), np.float32), 0.0).parts()
    assert message["deadline_ms"] == 0.0  # a spent budget is sent as one


def test_defaults_and_ignored_fields() -> None:
    request = parse_request(infer_map(extra=[1, 2], quantization=None))
    assert isinstance(request, InferRequest) and request.deadline_ms is None and request.quantization is None
    profile = parse_request({"op": "profile", "id": "p", "bundle": "b1", "batches": [2], "splits": None})
    assert profile == ProfileRequest("p", "b1", (2,), 10, None)
    assert parse_request({"op": "stats", "id": [1, {"a": None}]}) == StatsRequest([1, {"a": None}])  # ids: any msgpack


def test_a_quantized_infer_carries_its_parameters() -> None:
    request = parse_request(decoded(InferRequest(1, "b1", "s", Q, None, Quantization(0.5, 3))))
    assert isinstance(request, InferRequest) and request.quantization == Quantization(0.5, 3)


# -- replies ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "message", "match"),
    [
        ("infer", {"id": 1, "ok": True, "compute_ms": 1.0, "queue_ms": 0.0, "batch": 1}, "infer reply.tensor"),
        ("infer", {"id": 1, "ok": True, "tensor": CUT, "compute_ms": "1", "queue_ms": 0.0, "batch": 1},
         "infer reply.compute_ms: expected a number"),
        ("infer", {"id": 1, "ok": True, "tensor": CUT, "compute_ms": 1.0, "queue_ms": -1.0, "batch": 1},
         "infer reply.queue_ms: expected a finite number >= 0"),
        ("infer", {"id": 1, "ok": True, "tensor": CUT, "compute_ms": 1.0, "queue_ms": 0.0, "batch": 0},
         "infer reply.batch"),
        ("infer", {"id": 1, "ok": "yes"}, "infer reply ok: expected true or false"),
        ("hello", {"id": 1, "ok": True, "protocol": 1, "bundles": {"b": "x"}, "auth": False, "max_frame_bytes": 9,
                   "device": "cpu"}, "hello reply.bundles.b: expected a list of strings"),
        ("hello", {"id": 1, "ok": True, "protocol": 1, "bundles": {}, "auth": 0, "max_frame_bytes": 9,
                   "device": "cpu"}, "hello reply.auth: expected true or false"),
        ("ping", {"id": 1, "ok": True}, "ping reply.bytes"),
        ("stats", {"id": 1, "ok": True, "stats": []}, "stats reply.stats: expected an object"),
        ("profile", {"id": 1, "ok": True, "tail_ms": {"s": {"x": 1.0}}}, r"profile reply.tail_ms.s: .* 1..64"),
        ("profile", {"id": 1, "ok": True, "tail_ms": {"s": {"1": None}}}, "profile reply.tail_ms.s.1"),
        ("ping", {"id": 1, "ok": False, "error": {"code": "teapot", "message": ""}}, "error reply.error.code"),
        ("ping", {"id": 1, "ok": False, "error": "bad"}, "error reply.error: expected an object"),
    ],
)
def test_malformed_replies_name_the_field(op: str, message: dict, match: str) -> None:
    with pytest.raises(ProtocolError, match=match) as info:
        parse_reply(op, message)
    assert info.value.request_id == 1


def test_an_error_reply_parses_whatever_the_op() -> None:
    for op in OPS:
        reply = parse_reply(op, error_reply(3, "unknown_split", "no split x"))
        assert reply == ErrorReply(3, "unknown_split", "no split x")
    assert set(ERROR_CODES) >= {"bad_request", "deadline_exceeded"}


def test_error_reply_refuses_a_code_outside_the_protocol() -> None:
    with pytest.raises(AssertionError):
        error_reply(1, "teapot", "")


def test_a_chains_request_and_reply_carry_the_route_and_every_hops_times() -> None:
    route = (Hop("10.0.0.9:7767", "a+b+c", 2), Hop("[fd00::1]:7000", "a+b+c", 3))
    request = InferRequest(9, "b1", "a+b+c", CUT, 40.0, None, 1, route)
    same(parse_request(decoded(request)), request)
    hops = (HopTiming("10.0.0.9:7767", 2, 0.5, 3.0, 1.25, 4), HopTiming("[fd00::1]:7000", 3, 0.0, 2.0, 0.75, 4))
    reply = InferReply(9, CUT, 1.5, 0.25, 4, hops)
    same(parse_reply("infer", decoded(reply)), reply)
    # Without a chain, nothing of it is on the wire: frames stay byte for byte what they were.
    assert "route" not in decoded(InferRequest(9, "b1", "s", CUT)) and "hops" not in decoded(InferReply(9, CUT, 1.0, 0.0, 1))
    with pytest.raises(ProtocolError, match=r"infer reply.hops\[0\].link_ms"):
        parse_reply("infer", {**decoded(reply), "hops": [dict(hops[0].as_map(), link_ms="slow")]})
    with pytest.raises(ProtocolError, match="infer reply.hops: expected a list of at most 8"):
        parse_reply("infer", {**decoded(reply), "hops": [hops[0].as_map()] * 9})
    assert "hop_failed" in ERROR_CODES


def test_links_are_asked_for_and_answered_and_a_hosts_hello_carries_what_it_measured() -> None:
    request = LinksRequest(3, ("10.0.0.9:7767", "[fd00::1]:7000"), 65536)
    same(parse_request(decoded(request)), request)
    reply = LinksReply(3, {"10.0.0.9:7767": (9.4e8, 0.21)}, {"[fd00::1]:7000": "cannot connect"})
    same(parse_reply("links", decoded(reply)), reply)
    hello = HelloReply(1, PROTOCOL_VERSION, BUNDLES, False, 1 << 20, "cpu", {"10.0.0.9:7767": (9.4e8, 0.21)})
    same(parse_reply("hello", decoded(hello)), hello)
    with pytest.raises(ProtocolError, match=r"hello reply.links.10.0.0.9:7767.rate_bps"):
        parse_reply("hello", {**decoded(hello), "links": {"10.0.0.9:7767": {"rate_bps": "fast", "rtt_ms": 1.0}}})


def test_a_request_s_give_up_time_is_its_deadline_or_the_board_s_alternative_if_later() -> None:
    """The host answers within ``give_up_ms``: a board whose own answer takes 300 ms gives a 40 ms
    deadline up to 300 ms; one that would answer in 10 ms itself does not extend it; no deadline,
    no bound, whatever the alternative."""
    assert InferRequest(1, "b", "s", CUT, 40.0, alternative="local", alternative_ms=300.0).give_up_ms == 300.0
    assert InferRequest(1, "b", "s", CUT, 40.0, alternative="local", alternative_ms=10.0).give_up_ms == 40.0
    assert InferRequest(1, "b", "s", CUT, 40.0).give_up_ms == 40.0
    assert InferRequest(1, "b", "s", CUT, None, alternative="local", alternative_ms=10.0).give_up_ms is None
