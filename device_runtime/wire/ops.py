"""The protocol's words: each op's request and reply as a dataclass, built and parsed here only.

docs/protocol.md's table of requests, in code. Every field name (``deadline_ms``,
``compute_ms``, ``queue_ms``...) is written once, in the one builder (``parts``) and the one
parser (``parse``) of its message, so the device and the host cannot drift apart.
:data:`REQUESTS` maps each op to its request type (the host dispatches from it),
:data:`REPLIES` each op to the type of its ``ok`` reply; :func:`parse_request` and
:func:`parse_reply` check every field's type and range and raise :class:`ProtocolError`
(``bad_request``, carrying the request's id) naming the field.

Sans-IO and sans-bytes: messages here are the maps :func:`~device_runtime.wire._protocol.decode`
returns (a tensor already a numpy array) and ``parts`` returns what
:func:`~device_runtime.wire._protocol.encode` takes. ``infer`` is parsed per request at tens of
thousands a second: parsers are plain checks on a dict, with no reflection per call, and the
dataclasses are not frozen (a frozen one's ``__init__`` goes through ``object.__setattr__`` for
every field: a quarter of what typing the ops cost per round trip, measured with callgrind).
Maps are built in the key order senders have always used, so frames stay byte for byte what
they were, the tensor last.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, ClassVar, Optional, Union

import numpy as np

from device_runtime.wire.coding import CodedCut
from splitedge import Fields, shown
from splitedge.errors import ProtocolError

#: The messages, a public sub-face of :mod:`device_runtime.wire` (``from device_runtime.wire.ops import
#: InferRequest``); the protocol's version and its error codes are on the wire's face itself.
__all__ = [
    "DEFAULT_LINK_BYTES", "ERROR_CODES", "MAX_LINKS_REQUEST_BYTES", "MAX_PROFILE_REPEATS", "MAX_ROUTE_HOPS",
    "OPS", "REPLIES", "REQUESTS", "ErrorReply", "HelloReply", "HelloRequest", "Hop", "HopTiming",
    "InferReply", "InferRequest", "LinksReply", "LinksRequest", "PingReply", "PingRequest", "ProfileReply",
    "ProfileRequest", "Quantization", "Reply", "Request", "StatsReply", "StatsRequest", "error_reply",
    "parse_reply", "parse_request", "split_address",
]

PROTOCOL_VERSION = 1


class ErrorCode(str, Enum):
    """The typed errors of the protocol, one enum: each member *is* its string on the wire
    (``ErrorCode.OVERLOADED == "overloaded"``), so a peer's code compares with either."""

    BAD_REQUEST = "bad_request"
    UNKNOWN_BUNDLE = "unknown_bundle"
    UNKNOWN_SPLIT = "unknown_split"
    UNAUTHORIZED = "unauthorized"
    OVERLOADED = "overloaded"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    HOP_FAILED = "hop_failed"
    INTERNAL = "internal"

    __str__ = str.__str__  # the wire's word, in messages and f-strings, on every Python
    __format__ = str.__format__


ERROR_CODES = tuple(code.value for code in ErrorCode)
#: A chain's route: at most this many hops after the first host (stages run 1..n, n <= MAX_STAGE).
MAX_ROUTE_HOPS = 8
MAX_STAGE = MAX_ROUTE_HOPS + 1
MAX_ADDRESS_CHARS = 255
#: ``infer.alternative_ms``: a board's own answer claimed to take longer than a minute keeps no host
#: working on a frame past its deadline for it.
MAX_ALTERNATIVE_MS = 60_000.0
#: ``links``: the payload that measures a host-to-host rate (a few ms at a LAN's speed).
DEFAULT_LINK_BYTES = 256 * 1024
MAX_LINK_BYTES = 4 * 1024 * 1024
#: ``links``: what one request may have the host send in all (peers × bytes): a 1 KB request never
#: buys more than 10 MB of another host's link.
MAX_LINKS_REQUEST_BYTES = 8 * 1024 * 1024
#: ``profile``'s bounds: a calibration measures a few batch sizes a few times, never a long stall.
MAX_PROFILE_BATCH = 64
MAX_PROFILE_REPEATS = 50
DEFAULT_PROFILE_REPEATS = 10

_FIELDS = Fields(ProtocolError)  # raises ProtocolError("<field path>: expected ..., got ...")
_NO_TENSOR_FIELDS: Mapping[str, Any] = MappingProxyType({})

#: What :func:`~device_runtime.wire._protocol.encode` takes: the map without its tensor, the tensor
#: (None: none) and the tensor's own fields (``scale``, ``zero_point``).
Parts = tuple[dict[str, Any], Optional[np.ndarray], Mapping[str, Any]]


# -- field checks beyond splitedge._fields -------------------------------------------------------
# ``infer``'s parsers test the usual case inline and call a checker only to word the error.


def _is_ms(value: Any) -> bool:
    return type(value) is float and 0.0 <= value < math.inf


def _texts(value: Any, path: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ProtocolError(f"{path}: expected a list of strings, got {shown(value)}")
    return value


def _in_range(value: Any, path: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:  # type(): bool is no count
        raise ProtocolError(f"{path}: expected an integer in {low}..{high}, got {shown(value)}")
    return value


def _tensor(value: Any, path: str, needs: str = "expected") -> np.ndarray:
    if type(value) is not np.ndarray:
        raise ProtocolError(f"{path}: {needs} a tensor map, got {'nothing' if value is None else shown(value)}")
    return value


def _budget_ms(value: Any) -> float | None:
    """``deadline_ms`` as the code says it, converted here and in :meth:`InferRequest.parts` only:
    any number of milliseconds; zero or less is a budget already spent (the host answers
    ``deadline_exceeded``, not ``bad_request``), never "none". Absent, or infinite: no deadline, None."""
    if value is None:
        return None
    if type(value) is float:
        if math.isnan(value):
            raise ProtocolError(f"infer.deadline_ms must be a number of milliseconds, got {value!r}")
        return None if value == math.inf else value
    if type(value) is not int:
        raise ProtocolError(f"infer.deadline_ms must be a number of milliseconds, got {shown(value)}")
    return float(value)  # msgpack's ints end at 2**64: finite


def _alternative(message: Mapping[str, Any]) -> tuple[str | None, float | None]:
    """``alternative`` and ``alternative_ms``: the board's own option for a frame and its time, a
    finite number of ms no larger than MAX_ALTERNATIVE_MS (one claiming hours would hold the host's
    queue for it), or neither."""
    ms = message.get("alternative_ms")
    if ms is None:
        return None, None
    ms = _FIELDS.number(ms, "infer.alternative_ms")
    if ms > MAX_ALTERNATIVE_MS:
        raise ProtocolError(f"infer.alternative_ms: at most {MAX_ALTERNATIVE_MS:g} ms, got {ms:g}")
    name = message.get("alternative", "local")
    return _FIELDS.text(name, "infer.alternative"), ms


# -- requests ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Quantization:
    """An affine uint8 tensor's parameters: ``real = scale * (q - zero_point)``."""

    scale: float
    zero_point: int


@dataclass(slots=True)
class HelloRequest:
    """The first request on a connection: the device's protocol version."""

    id: Any
    protocol: int = PROTOCOL_VERSION
    op: ClassVar[str] = "hello"

    def parts(self) -> Parts:
        return {"op": "hello", "protocol": self.protocol, "id": self.id}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> HelloRequest:
        protocol = message.get("protocol")
        if type(protocol) is not int or protocol != PROTOCOL_VERSION:
            raise ProtocolError(
                f"hello.protocol: protocol version {shown(protocol)} is not spoken here; "
                f"this host speaks {PROTOCOL_VERSION}"
            )
        return cls(message.get("id"), protocol)


@dataclass(slots=True)
class Hop:
    """A host further along a chain: where it listens (``host:port``) and which stage of ``split`` it runs."""

    address: str
    split: str
    stage: int

    def as_map(self) -> dict[str, Any]:
        return {"address": self.address, "split": self.split, "stage": self.stage}


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port); ValueError names what is wrong."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)


def _address(value: Any, path: str) -> str:
    """A peer's ``host:port`` from a request: text, bounded, with a port."""
    address = _FIELDS.text(value, path)
    try:
        if len(address) > MAX_ADDRESS_CHARS:
            raise ValueError(f"longer than {MAX_ADDRESS_CHARS} characters")
        split_address(address)
    except ValueError as exc:
        raise ProtocolError(f"{path}: {exc}") from None
    return address


def _route(value: Any, stage: int | None) -> tuple[Hop, ...]:
    """The hops after this one: at most MAX_ROUTE_HOPS, stages counting up from this request's
    by one (so a route can neither loop nor skip a stage), each at a ``host:port``."""
    if value is None:
        return ()
    if stage is None:
        raise ProtocolError("infer.route: a route is only for a chain's stage (infer.stage)")
    if not isinstance(value, list) or len(value) > MAX_ROUTE_HOPS:
        raise ProtocolError(f"infer.route: expected a list of at most {MAX_ROUTE_HOPS} hops, got {shown(value)}")
    hops = []
    for i, raw in enumerate(value):
        path = f"infer.route[{i}]"
        hop = _FIELDS.obj(raw, path)
        address = _address(hop.get("address"), f"{path}.address")
        expected = stage + 1 + i
        if hop.get("stage") != expected or type(hop.get("stage")) is not int:
            raise ProtocolError(f"{path}.stage: expected {expected} (each hop runs the next stage), "
                                f"got {shown(hop.get('stage'))}")
        hops.append(Hop(address, _FIELDS.text(hop.get("split"), f"{path}.split"), expected))
    return tuple(hops)


@dataclass(slots=True)
class InferRequest:
    """Run the tail of ``split`` on ``tensor`` (the cut, batch first) within ``deadline_ms`` of arrival.

    For a chain, ``stage`` names the stage this host runs, and ``route`` the hosts that run the
    stages after it: this host passes its output on to ``route[0]`` with the rest of the route,
    and answers with what comes back (:class:`InferReply`'s ``hops``)."""

    id: Any
    bundle: str
    split: str
    tensor: np.ndarray
    deadline_ms: float | None = None  # None: no deadline (absent on the wire); 0 or less: already spent
    quantization: Quantization | None = None  # the tensor is affine uint8
    stage: int | None = None  # a chain's stage (1..n); None: the split's tail
    route: tuple[Hop, ...] = ()
    # What the board would do instead (``local``: its full model) and how long that would take (ms):
    # the host refuses for the deadline only what it would answer after both the deadline and the
    # board's own answer (issue 43: a board refused for 1.5 ms of a 42 ms deadline ran its full model
    # itself for 300-600 ms). None: the board has no estimate, and the deadline alone decides.
    alternative: str | None = None
    alternative_ms: float | None = None
    coding: CodedCut | None = None  # the tensor is a cut's packed bits in the split's coding (issue 47)
    op: ClassVar[str] = "infer"

    @property
    def give_up_ms(self) -> float | None:
        """How long after arrival the host may still answer to any use (None: no bound): the
        deadline, or the board's alternative's time where that is later."""
        if self.deadline_ms is None:
            return None
        return self.deadline_ms if self.alternative_ms is None else max(self.deadline_ms, self.alternative_ms)

    def parts(self) -> Parts:
        message: dict[str, Any] = {"op": "infer", "bundle": self.bundle, "split": self.split}
        if self.deadline_ms is not None:
            message["deadline_ms"] = self.deadline_ms
        if self.alternative_ms is not None:
            message["alternative_ms"] = self.alternative_ms
            message["alternative"] = self.alternative or "local"
        if self.stage is not None:
            message["stage"] = self.stage
        if self.route:
            message["route"] = [hop.as_map() for hop in self.route]
        message["id"] = self.id
        q, coded = self.quantization, self.coding
        if coded is not None:
            return message, self.tensor, coded.fields()
        return message, self.tensor, (_NO_TENSOR_FIELDS if q is None else {"scale": q.scale, "zero_point": q.zero_point})

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> InferRequest:
        tensor = message.get("tensor")
        if type(tensor) is not np.ndarray:
            _tensor(tensor, "infer.tensor", "infer needs")  # raises
        deadline_ms = message.get("deadline_ms")
        if type(deadline_ms) is not float or not deadline_ms < math.inf:  # the usual case inline; not NaN, not inf
            deadline_ms = _budget_ms(deadline_ms)
        quantization = message.get("quantization")  # decode() sets it from the tensor's own fields
        if quantization is not None:
            if tensor.dtype != np.uint8:
                raise ProtocolError(f"infer.tensor: a quantized tensor must be uint8, got {tensor.dtype.name}")
            quantization = Quantization(quantization["scale"], quantization["zero_point"])
        bundle, split, stage = message.get("bundle"), message.get("split"), message.get("stage")
        if stage is not None:
            stage = _in_range(stage, "infer.stage", 1, MAX_STAGE)
        return cls(
            message.get("id"),
            bundle if type(bundle) is str else _FIELDS.text(bundle, "infer.bundle", empty=True),
            split if type(split) is str else _FIELDS.text(split, "infer.split", empty=True),
            tensor,
            deadline_ms,
            quantization,
            stage,
            _route(message.get("route"), stage),
            *_alternative(message),
            message.get("coding"),  # decode() sets it from the tensor's own fields, checked there
        )


@dataclass(slots=True)
class PingRequest:
    """A round trip; with ``tensor``, a payload that probes the link rate."""

    id: Any
    tensor: np.ndarray | None = None
    op: ClassVar[str] = "ping"

    def parts(self) -> Parts:
        return {"op": "ping", "id": self.id}, self.tensor, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> PingRequest:
        payload = message.get("tensor")
        return cls(message.get("id"), None if payload is None else _tensor(payload, "ping.tensor"))


@dataclass(slots=True)
class StatsRequest:
    """The host's figures (its Prometheus registry as a map)."""

    id: Any
    op: ClassVar[str] = "stats"

    def parts(self) -> Parts:
        return {"op": "stats", "id": self.id}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> StatsRequest:
        return cls(message.get("id"))


@dataclass(slots=True)
class ProfileRequest:
    """Time tails on the host: each of ``splits`` (None: every split served) at each batch size."""

    id: Any
    bundle: str
    batches: tuple[int, ...]
    repeats: int = DEFAULT_PROFILE_REPEATS
    splits: tuple[str, ...] | None = None
    op: ClassVar[str] = "profile"

    def parts(self) -> Parts:
        message: dict[str, Any] = {"op": "profile", "bundle": self.bundle, "batches": list(self.batches),
                                   "repeats": self.repeats}
        if self.splits is not None:
            message["splits"] = list(self.splits)
        message["id"] = self.id
        return message, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> ProfileRequest:
        batches = message.get("batches")
        if not isinstance(batches, list) or not batches:
            raise ProtocolError(f"profile.batches: expected a non-empty list of batch sizes, got {shown(batches)}")
        for i, batch in enumerate(batches):
            _in_range(batch, f"profile.batches[{i}]", 1, MAX_PROFILE_BATCH)
        splits = message.get("splits")
        return cls(
            message.get("id"),
            _FIELDS.text(message.get("bundle"), "profile.bundle", empty=True),
            tuple(batches),
            _in_range(message.get("repeats", DEFAULT_PROFILE_REPEATS), "profile.repeats", 1, MAX_PROFILE_REPEATS),
            None if splits is None else tuple(_texts(splits, "profile.splits")),
        )


@dataclass(slots=True)
class LinksRequest:
    """Measure this host's links to ``peers`` (``host:port`` each): a bare ``ping`` for the round
    trip, one of ``bytes`` for the rate. What a board needs to place a chain's later stages, which
    it cannot measure itself (DESIGN.md, "Chains and fragments")."""

    id: Any
    peers: tuple[str, ...]
    bytes: int = DEFAULT_LINK_BYTES
    op: ClassVar[str] = "links"

    def parts(self) -> Parts:
        return {"op": "links", "peers": list(self.peers), "bytes": self.bytes, "id": self.id}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> LinksRequest:
        peers = message.get("peers")
        if not isinstance(peers, list) or not 0 < len(peers) <= MAX_ROUTE_HOPS:
            raise ProtocolError(f"links.peers: expected a list of 1..{MAX_ROUTE_HOPS} addresses, got {shown(peers)}")
        for i, address in enumerate(peers):
            _address(address, f"links.peers[{i}]")
        payload = _in_range(message.get("bytes", DEFAULT_LINK_BYTES), "links.bytes", 1, MAX_LINK_BYTES)
        if len(peers) * payload > MAX_LINKS_REQUEST_BYTES:
            raise ProtocolError(f"links: {len(peers)} peers × {payload} bytes is over {MAX_LINKS_REQUEST_BYTES} bytes a "
                                "request; ask for fewer peers or bytes, in several requests")
        return cls(message.get("id"), tuple(peers), payload)


Request = Union[HelloRequest, InferRequest, PingRequest, StatsRequest, ProfileRequest, LinksRequest]
#: op -> its request type: the one table a host dispatches from.
REQUESTS: Mapping[str, type[Request]] = MappingProxyType(
    {cls.op: cls for cls in (HelloRequest, InferRequest, PingRequest, StatsRequest, ProfileRequest, LinksRequest)}
)
OPS = tuple(REQUESTS)


def parse_request(message: Mapping[str, Any]) -> Request:
    """The typed request in a decoded frame (:func:`~device_runtime.wire._protocol.decode`'s map).

    Raises :class:`ProtocolError` (``bad_request``, with the request's id) for an unknown op or
    a field of the wrong type or out of range. What only the host can judge (is the bundle
    served? does the tensor fit the tail?) is the host's to check; fields no op reads are ignored.
    """
    op = message.get("op")
    request_type = REQUESTS.get(op) if isinstance(op, str) else None
    try:
        if request_type is None:
            raise ProtocolError(f"unknown op {shown(op)}; ops: {', '.join(OPS)}")
        return request_type.parse(message)
    except ProtocolError as exc:
        exc.request_id = message.get("id")  # the map was read: the error reply can carry the id
        raise


# -- replies -----------------------------------------------------------------------------------


@dataclass(slots=True)
class HelloReply:
    """What a host serves: its protocol, ``{bundle id: [split ids]}``, whether frames must be
    authenticated, its frame-size limit and where its tails run (``cpu`` or ``cuda``); and the
    links to other hosts it last measured (``links``: address -> (rate bit/s, round trip ms)),
    which a board placing a chain reads (absent until the host has measured any).

    ``profile_budget_ms`` is what one ``profile`` request may spend of the host's time
    (``--profile-budget-ms``): a board fits its calibration's requests to it rather than learning
    it from refusals. None: a host from before it was announced, whose refusals are all a board has."""

    id: Any
    protocol: int
    bundles: dict[str, list[str]]
    auth: bool
    max_frame_bytes: int
    device: str
    links: dict[str, tuple[float, float]] = field(default_factory=dict)
    profile_budget_ms: float | None = None
    #: The budgets a host may announce (``--profile-budget-ms``'s range), ms: a board plans its requests
    #: from it, so it is bounded like every count; an hour of tail runs a request is past any calibration.
    MIN_PROFILE_BUDGET_MS: ClassVar[float] = 1.0
    MAX_PROFILE_BUDGET_MS: ClassVar[float] = 3_600_000.0

    def parts(self) -> Parts:
        message = {
            "id": self.id, "ok": True, "protocol": self.protocol, "bundles": self.bundles, "auth": self.auth,
            "max_frame_bytes": self.max_frame_bytes, "device": self.device,
        }
        if self.links:
            message["links"] = _links_map(self.links)
        if self.profile_budget_ms is not None:
            message["profile_budget_ms"] = self.profile_budget_ms
        return message, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> HelloReply:
        bundles = _FIELDS.obj(message.get("bundles"), "hello reply.bundles")
        for bundle_id, splits in bundles.items():
            _FIELDS.text(bundle_id, "hello reply.bundles")
            _texts(splits, f"hello reply.bundles.{bundle_id}")
        return cls(
            message.get("id"),
            _FIELDS.integer(message.get("protocol"), "hello reply.protocol", 1),
            dict(bundles),
            _FIELDS.flag(message.get("auth"), "hello reply.auth"),
            _FIELDS.integer(message.get("max_frame_bytes"), "hello reply.max_frame_bytes", 1),
            _FIELDS.text(message.get("device"), "hello reply.device"),
            _parse_links(message.get("links", {}), "hello reply.links"),
            _profile_budget_ms(message.get("profile_budget_ms"), "hello reply.profile_budget_ms"),
        )


def _profile_budget_ms(value: Any, path: str) -> float | None:
    """A host's announced ``profile`` budget: absent (None) from older hosts; else ms within the
    range a host may announce, since a board sizes its requests from it."""
    if value is None:
        return None
    low, high = HelloReply.MIN_PROFILE_BUDGET_MS, HelloReply.MAX_PROFILE_BUDGET_MS
    budget = _FIELDS.number(value, path, low)
    if budget > high:
        raise ProtocolError(f"{path}: expected a number of ms in {low:g}..{high:g}, got {shown(value)}")
    return budget


def _links_map(links: Mapping[str, tuple[float, float]]) -> dict[str, dict[str, float]]:
    return {address: {"rate_bps": rate, "rtt_ms": rtt} for address, (rate, rtt) in links.items()}


def _parse_links(value: Any, path: str) -> dict[str, tuple[float, float]]:
    links = {}
    for address, link in _FIELDS.obj(value, path).items():
        where = f"{path}.{address}"
        link = _FIELDS.obj(link, where)
        links[_FIELDS.text(address, path)] = (
            _FIELDS.number(link.get("rate_bps"), f"{where}.rate_bps"), _FIELDS.number(link.get("rtt_ms"), f"{where}.rtt_ms"))
    return links


@dataclass(slots=True)
class HopTiming:
    """Where the time went at one hop of a chain after the first host: its queue and compute, as it
    measured them, and ``link_ms``, the rest of the round trip from the host before it (the link
    both ways, framing), as that host measured it."""

    address: str
    stage: int
    queue_ms: float
    compute_ms: float
    link_ms: float
    batch: int

    def as_map(self) -> dict[str, Any]:
        return {"address": self.address, "stage": self.stage, "queue_ms": self.queue_ms,
                "compute_ms": self.compute_ms, "link_ms": self.link_ms, "batch": self.batch}

    @classmethod
    def parse(cls, raw: Any, path: str) -> HopTiming:
        hop = _FIELDS.obj(raw, path)
        return cls(
            _FIELDS.text(hop.get("address"), f"{path}.address"),
            _in_range(hop.get("stage"), f"{path}.stage", 1, MAX_STAGE),
            _FIELDS.number(hop.get("queue_ms"), f"{path}.queue_ms"),
            _FIELDS.number(hop.get("compute_ms"), f"{path}.compute_ms"),
            _FIELDS.number(hop.get("link_ms"), f"{path}.link_ms"),
            _FIELDS.integer(hop.get("batch"), f"{path}.batch", 1),
        )


@dataclass(slots=True)
class InferReply:
    """The tail's output for this request's samples; ``compute_ms`` is the tail time of the batch it
    ran in (``batch`` samples), ``queue_ms`` the wait from its arrival to that batch's start. For a
    chain, these are the first host's and ``hops`` the rest, in route order."""

    id: Any
    tensor: np.ndarray
    compute_ms: float
    queue_ms: float
    batch: int
    hops: tuple[HopTiming, ...] = ()

    def parts(self) -> Parts:
        message: dict[str, Any] = {"id": self.id, "ok": True, "compute_ms": self.compute_ms, "queue_ms": self.queue_ms,
                                   "batch": self.batch}
        if self.hops:
            message["hops"] = [hop.as_map() for hop in self.hops]
        return message, self.tensor, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> InferReply:
        compute_ms, queue_ms, batch = message.get("compute_ms"), message.get("queue_ms"), message.get("batch")
        tensor, hops = message.get("tensor"), message.get("hops")
        if hops is not None and (not isinstance(hops, list) or len(hops) > MAX_ROUTE_HOPS):
            raise ProtocolError(f"infer reply.hops: expected a list of at most {MAX_ROUTE_HOPS}, got {shown(hops)}")
        return cls(
            message.get("id"),
            tensor if type(tensor) is np.ndarray else _tensor(tensor, "infer reply.tensor"),
            compute_ms if _is_ms(compute_ms) else _FIELDS.number(compute_ms, "infer reply.compute_ms"),
            queue_ms if _is_ms(queue_ms) else _FIELDS.number(queue_ms, "infer reply.queue_ms"),
            batch if type(batch) is int and batch >= 1 else _FIELDS.integer(batch, "infer reply.batch", 1),
            () if hops is None else tuple(HopTiming.parse(h, f"infer reply.hops[{i}]") for i, h in enumerate(hops)),
        )


@dataclass(slots=True)
class PingReply:
    """``bytes``: the size of the payload the host received (0 without one)."""

    id: Any
    bytes: int

    def parts(self) -> Parts:
        return {"id": self.id, "ok": True, "bytes": self.bytes}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> PingReply:
        return cls(message.get("id"), _FIELDS.integer(message.get("bytes"), "ping reply.bytes", 0))


@dataclass(slots=True)
class StatsReply:
    """The host's figures, one key per metric (docs/protocol.md, "Stats and metrics")."""

    id: Any
    stats: dict[str, Any]

    def parts(self) -> Parts:
        return {"id": self.id, "ok": True, "stats": self.stats}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> StatsReply:
        return cls(message.get("id"), dict(_FIELDS.obj(message.get("stats"), "stats reply.stats")))


@dataclass(slots=True)
class ProfileReply:
    """``tail_ms``: ``{split: {batch size: median ms}}``, measured on the host. On the wire the batch
    sizes are strings (map keys every msgpack reader takes)."""

    id: Any
    tail_ms: dict[str, dict[int, float]]

    def parts(self) -> Parts:
        tail_ms = {split: {str(batch): ms for batch, ms in times.items()} for split, times in self.tail_ms.items()}
        return {"id": self.id, "ok": True, "tail_ms": tail_ms}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> ProfileReply:
        tail_ms: dict[str, dict[int, float]] = {}
        for split, times in _FIELDS.obj(message.get("tail_ms"), "profile reply.tail_ms").items():
            path = f"profile reply.tail_ms.{split}"
            tail_ms[_FIELDS.text(split, "profile reply.tail_ms")] = {
                _batch_key(batch, path): _FIELDS.number(ms, f"{path}.{batch}")
                for batch, ms in _FIELDS.obj(times, path).items()
            }
        return cls(message.get("id"), tail_ms)


def _batch_key(key: Any, path: str) -> int:
    """A batch size written as a map key: ``"8"`` (or 8)."""
    if isinstance(key, str) and key.isdigit():
        key = int(key)
    return _in_range(key, path, 1, MAX_PROFILE_BATCH)


@dataclass(slots=True)
class ErrorReply:
    """A typed error: ``code`` is one of :data:`ERROR_CODES`; ``id`` is null when the request's
    map could not be read."""

    id: Any
    code: str
    message: str

    def parts(self) -> Parts:
        assert self.code in ERROR_CODES, self.code
        error = {"code": str(self.code), "message": self.message}
        return {"id": self.id, "ok": False, "error": error}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> ErrorReply:
        error = _FIELDS.obj(message.get("error"), "error reply.error")
        return cls(
            message.get("id"),
            _FIELDS.choice(error.get("code"), "error reply.error.code", ERROR_CODES),
            _FIELDS.text(error.get("message"), "error reply.error.message", empty=True),
        )


@dataclass(slots=True)
class LinksReply:
    """``links``: address -> (rate bit/s, round trip ms) for each peer measured; ``failed``: address ->
    why, for each that could not be (unreachable, not allowed: :mod:`host_runtime._peers`)."""

    id: Any
    links: dict[str, tuple[float, float]]
    failed: dict[str, str]

    def parts(self) -> Parts:
        return {"id": self.id, "ok": True, "links": _links_map(self.links), "failed": self.failed}, None, _NO_TENSOR_FIELDS

    @classmethod
    def parse(cls, message: Mapping[str, Any]) -> LinksReply:
        failed = _FIELDS.obj(message.get("failed", {}), "links reply.failed")
        return cls(message.get("id"), _parse_links(message.get("links"), "links reply.links"),
                   {_FIELDS.text(a, "links reply.failed"): _FIELDS.text(why, f"links reply.failed.{a}", empty=True)
                    for a, why in failed.items()})


Reply = Union[HelloReply, InferReply, PingReply, StatsReply, ProfileReply, LinksReply, ErrorReply]
#: op -> the type of its ``ok`` reply (a reply does not name its op: the asker knows it).
REPLIES: Mapping[str, type[Reply]] = MappingProxyType(
    {"hello": HelloReply, "infer": InferReply, "ping": PingReply, "stats": StatsReply, "profile": ProfileReply,
     "links": LinksReply}
)
assert REPLIES.keys() == REQUESTS.keys(), "every op has one request type and one reply type"
Message = Union[Request, Reply]


def parse_reply(op: str, message: Mapping[str, Any]) -> Reply:
    """The typed reply to an ``op`` request: its ok reply, or an :class:`ErrorReply` whatever the op.

    Raises :class:`ProtocolError` (with the reply's id) naming the field that is missing or wrong.
    """
    ok = message.get("ok")
    try:
        if ok is False:
            return ErrorReply.parse(message)
        if ok is not True:
            raise ProtocolError(f"{op} reply ok: expected true or false, got {shown(ok)}")
        return REPLIES[op].parse(message)
    except ProtocolError as exc:
        exc.request_id = message.get("id")
        raise


def error_reply(request_id: Any, code: str, message: str) -> dict[str, Any]:
    """The map of the typed error every failure is reported as; ``code`` is one of :data:`ERROR_CODES`."""
    return ErrorReply(request_id, code, message).parts()[0]
