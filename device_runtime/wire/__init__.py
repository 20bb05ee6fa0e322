"""Contract 2, the wire protocol: everything a board and a host must agree on to talk.

The codec both sides share and nothing else: framing (a 4-byte length, then a msgpack map), a
bounds-checked msgpack reader, the frame codec, the cut tensor's affine uint8 quantization,
frame authentication (HMAC) and TLS, and the asyncio connection that feeds the codec. Two public
sub-faces hold groups of their own: the ops' typed requests and replies (:mod:`device_runtime.wire.ops`)
and the zeroconf TXT record (:mod:`device_runtime.wire.txt`). The rest is private (``_framing``,
``_protocol``, ...). The board's client is not here: :mod:`device_runtime.link`. See docs/protocol.md.
"""

from device_runtime.wire._auth import REFUSAL_KINDS, DeviceAuth, FrameAuth, HostAuth, load_key
from device_runtime.wire._connection import FramedProtocol
from device_runtime.wire._framing import DEFAULT_MAX_FRAME_BYTES, FrameBudget, FrameDecoder, Oversized
from device_runtime.wire._msgpack_view import DecodeLimits
from device_runtime.wire._protocol import REPLY_LIMITS, REQUEST_LIMITS, decode, decode_tensor, encode, encode_bytes, encode_message
from device_runtime.wire._quantization import affine_params, dequantize, quantize
from device_runtime.wire._tls import accept_tls, client_context, server_context
from device_runtime.wire.ops import PROTOCOL_VERSION, ErrorCode

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DecodeLimits",
    "DeviceAuth",
    "ErrorCode",
    "FrameAuth",
    "FrameBudget",
    "FrameDecoder",
    "FramedProtocol",
    "HostAuth",
    "Oversized",
    "PROTOCOL_VERSION",
    "REFUSAL_KINDS",
    "REPLY_LIMITS",
    "REQUEST_LIMITS",
    "accept_tls",
    "affine_params",
    "client_context",
    "decode",
    "decode_tensor",
    "dequantize",
    "encode",
    "encode_bytes",
    "encode_message",
    "load_key",
    "quantize",
    "server_context",
]
