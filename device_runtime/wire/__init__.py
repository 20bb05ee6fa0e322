"""Contract 2, the wire protocol: everything a board and a host must agree on to talk.

Framing (a 4-byte length, then a msgpack map), a bounds-checked msgpack reader, the frame
codec, the ops (each request and reply typed, with one builder and one parser), the cut tensor's affine uint8 quantization, frame authentication (HMAC) and TLS, the
asyncio connection that feeds the codec, and the zeroconf TXT record. The host imports this
package (and ``device_runtime.bundle``), nothing else of the board runtime. See docs/protocol.md.
"""

from device_runtime.wire.auth import DeviceAuth, FrameAuth, HostAuth, load_key
from device_runtime.wire.connection import FramedProtocol
from device_runtime.wire.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, Oversized
from device_runtime.wire.ops import (
    ERROR_CODES,
    MAX_ROUTE_HOPS,
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
    PingReply,
    PingRequest,
    ProfileReply,
    ProfileRequest,
    Quantization,
    Reply,
    Request,
    StatsReply,
    StatsRequest,
    error_reply,
    parse_reply,
    parse_request,
)
from device_runtime.wire.msgpack_view import DecodeLimits
from device_runtime.wire.protocol import REPLY_LIMITS, REQUEST_LIMITS, decode, decode_tensor, encode, encode_bytes, encode_message
from device_runtime.wire.quantization import affine_params, dequantize, quantize
from device_runtime.wire.tls import accept_tls, client_context, server_context
from device_runtime.wire.txt import TxtRecord, parse_txt, txt_record

from device_runtime.wire.auth import REFUSAL_KINDS
from device_runtime.wire.framing import FrameBudget
from device_runtime.wire.ops import MAX_LINKS_REQUEST_BYTES, ErrorCode, LinksReply, LinksRequest, MAX_PROFILE_REPEATS, split_address
from device_runtime.wire.txt import SERVICE_TYPE, open_zeroconf

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DecodeLimits",
    "DeviceAuth",
    "ERROR_CODES",
    "ErrorCode",
    "ErrorReply",
    "FrameAuth",
    "FrameBudget",
    "FrameDecoder",
    "FramedProtocol",
    "HelloReply",
    "HelloRequest",
    "Hop",
    "HopTiming",
    "HostAuth",
    "InferReply",
    "InferRequest",
    "LinksReply",
    "LinksRequest",
    "MAX_LINKS_REQUEST_BYTES",
    "MAX_PROFILE_REPEATS",
    "MAX_ROUTE_HOPS",
    "OPS",
    "Oversized",
    "PROTOCOL_VERSION",
    "PingReply",
    "PingRequest",
    "ProfileReply",
    "ProfileRequest",
    "Quantization",
    "REFUSAL_KINDS",
    "REPLIES",
    "REPLY_LIMITS",
    "REQUESTS",
    "REQUEST_LIMITS",
    "Reply",
    "Request",
    "SERVICE_TYPE",
    "StatsReply",
    "StatsRequest",
    "TxtRecord",
    "affine_params",
    "accept_tls",
    "client_context",
    "decode",
    "decode_tensor",
    "dequantize",
    "encode",
    "encode_bytes",
    "encode_message",
    "error_reply",
    "load_key",
    "open_zeroconf",
    "parse_reply",
    "parse_request",
    "parse_txt",
    "quantize",
    "server_context",
    "split_address",
    "txt_record",
]
