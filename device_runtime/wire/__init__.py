"""Contract 2, the wire protocol: everything a board and a host must agree on to talk.

Framing (a 4-byte length, then a msgpack map), a bounds-checked msgpack reader, the op
codec, the cut tensor's affine uint8 quantization, frame authentication (HMAC) and TLS, the
asyncio connection that feeds the codec, and the zeroconf TXT record. The host imports this
package (and ``device_runtime.bundle``), nothing else of the board runtime. See docs/protocol.md.
"""


from device_runtime.wire.auth import DeviceAuth, FrameAuth, HostAuth, load_key
from device_runtime.wire.connection import FramedProtocol
from device_runtime.wire.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, Oversized
from device_runtime.wire.protocol import (
    ERROR_CODES,
    OPS,
    PROTOCOL_VERSION,
    decode,
    decode_tensor,
    encode,
    encode_bytes,
    error_reply,
)
from device_runtime.wire.quantization import affine_params, dequantize, quantize
from device_runtime.wire.tls import client_context, server_context
from device_runtime.wire.txt import TxtRecord, parse_txt, txt_record

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DeviceAuth",
    "ERROR_CODES",
    "FrameAuth",
    "FrameDecoder",
    "FramedProtocol",
    "HostAuth",
    "OPS",
    "Oversized",
    "PROTOCOL_VERSION",
    "TxtRecord",
    "affine_params",
    "client_context",
    "decode",
    "decode_tensor",
    "dequantize",
    "encode",
    "encode_bytes",
    "error_reply",
    "load_key",
    "parse_txt",
    "quantize",
    "server_context",
    "txt_record",
]
