"""Per-frame authentication with a pre-shared key: HMAC-SHA256, bound to the connection and direction.

Sans-IO, like the codec: :class:`HostAuth` and :class:`DeviceAuth` hold one connection's state
and turn frames into frames; :class:`~device_runtime.wire._connection.FramedProtocol` feeds them.
The layout and the handshake are specified in ``docs/protocol.md`` ("Authentication"):

1. On connect the host sends one plain frame, ``{op: challenge, nonce: Nh}`` (16 random bytes).
2. The device's first frame is authenticated and carries its own nonce: ``{op: auth, nonce: Nd}``.
3. From then on every frame, both ways, is ``0xC1 | counter u64 | tag[32] | msgpack map`` with

   ``tag = HMAC-SHA256(key, LABEL || sender || Nh [|| Nd] || counter || map)``

   where ``sender`` is ``D`` (device → host; bound to Nh, the host's nonce) or ``H`` (host →
   device; bound to Nh and Nd). Each side verifies only frames bound to a nonce it drew itself,
   so a frame recorded on another connection, or reflected back to its sender, never verifies;
   counters start at 1 per direction and must go up by exactly one, so a frame replayed on its
   own connection does not verify either.

The tag covers the whole map, tensor bytes included, but the tensor is never copied: HMAC is
updated over the codec's prefix and the array's memoryview in turn.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import stat
import struct
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

from device_runtime.wire._framing import LENGTH
from device_runtime.wire._msgpack_view import unpack
from device_runtime.wire.ops import ErrorCode
from splitedge.errors import CredentialsError, FrameRefused, ProtocolError

__all__ = [
    "DeviceAuth", "FrameAuth", "HostAuth", "load_key", "MAX_HANDSHAKE_BYTES", "MIN_KEY_BYTES", "REFUSAL_KINDS", "SCHEME",
]

SCHEME = "hmac-sha256"
LABEL = b"splitedge-frame-v1"  # domain separation: these tags mean nothing anywhere else
MARK = 0xC1  # "never used" in msgpack: an authenticated body is never mistaken for a plain map
ENVELOPE = struct.Struct(">BQ32s")  # mark, counter, tag: 41 bytes in front of the msgpack map
COUNTER = struct.Struct(">Q")
NONCE_BYTES = 16
MIN_KEY_BYTES = 16  # 128 bits; `openssl rand -hex 32` gives 64 characters
#: A plain frame is only ever a challenge or a refusal: a few dozen bytes. Nothing larger is parsed.
MAX_PLAIN_BYTES = 4096
#: Until the handshake is complete a frame is a challenge, a refusal, the device's auth frame or
#: the hello sent right behind it: a few dozen bytes each. A longer length prefix is refused at
#: once, so a peer without the key never makes the other side allocate a frame buffer.
MAX_HANDSHAKE_BYTES = 4096
SENT_BY_DEVICE, SENT_BY_HOST = b"D", b"H"
#: Why a host refuses a frame (``FrameRefused.kind``): a closed set, for the host's stats.
REFUSAL_KINDS = ("unauthenticated", "bad_mac", "replayed", "handshake")
AUTH_FAILED = "authentication failed"

Buffer = Union[bytes, bytearray, memoryview]


def load_key(path: str | Path) -> bytes:
    """The pre-shared key in ``path``: its bytes, surrounding whitespace removed (so a hex key
    written by ``openssl rand -hex 32 > FILE`` works). Refuses a file that any user can read, an
    empty one and one shorter than :data:`MIN_KEY_BYTES`."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise CredentialsError(f"key file {path}: {exc.strerror or exc}") from exc
    if mode & stat.S_IROTH:
        raise CredentialsError(
            f"key file {path} is readable by every user (mode {stat.S_IMODE(mode):o}): "
            f"anyone on this machine could use the host; run chmod 600 {path}"
        )
    key = data.strip()
    if not key:
        raise CredentialsError(f"key file {path} is empty; write a key with: openssl rand -hex 32 > {path}")
    if len(key) < MIN_KEY_BYTES:
        raise CredentialsError(
            f"key file {path} holds {len(key)} bytes, too short: at least {MIN_KEY_BYTES}; "
            f"write a key with: openssl rand -hex 32 > {path}"
        )
    return key


class _Stream:
    """One direction of one connection: the keyed HMAC, primed with its context, and the next counter."""

    def __init__(self, key: bytes, context: bytes) -> None:
        # The key schedule and the fixed-length context are hashed once per connection; each
        # frame copies this state (a few hundred bytes) and adds only its counter and its body.
        self._primed = hmac.new(key, LABEL + context, hashlib.sha256)
        self.counter = 1

    def tag(self, counter: int, parts: Iterable[Buffer]) -> bytes:
        mac = self._primed.copy()
        mac.update(COUNTER.pack(counter))
        for part in parts:
            mac.update(part)
        return mac.digest()


class FrameAuth:
    """One side of one connection: seal outgoing frames, open incoming ones.

    ``open`` returns the msgpack map's bytes (a view: no copy), or None for a handshake frame it
    consumed itself; it raises :class:`FrameRefused` for anything that does not verify.
    """

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a key needs at least {MIN_KEY_BYTES} bytes, got {len(key)}")
        self._key = key
        self._out: _Stream | None = None  # None until the handshake allows sealing
        self._in: _Stream | None = None

    @property
    def established(self) -> bool:
        return self._out is not None and self._in is not None

    def greeting(self) -> dict[str, Any] | None:
        """A plain frame to send as soon as the connection is made (the host's challenge)."""
        return None

    def open(self, body: memoryview) -> memoryview | None:
        raise NotImplementedError

    def seal(self, buffers: Sequence[Buffer]) -> list[Buffer]:
        """``[length + prefix, tensor...]`` from the codec → the same frame, authenticated.

        Before the handshake there is nothing to bind a tag to: the frame goes out plain (the
        host's challenge, or its refusal of a peer that never authenticated).
        """
        stream = self._out
        if stream is None:
            return list(buffers)
        head = bytes(buffers[0][LENGTH.size :])  # the msgpack prefix: small, the tensor is buffers[1]
        parts = [head, *buffers[1:]]
        counter = stream.counter
        stream.counter += 1
        tag = stream.tag(counter, parts)
        size = ENVELOPE.size + sum(memoryview(part).nbytes for part in parts)
        return [LENGTH.pack(size) + ENVELOPE.pack(MARK, counter, tag) + head, *buffers[1:]]

    def skipped(self) -> None:
        """An oversized frame was dropped unread; its sender used one counter value on it."""
        if self._in is not None:
            self._in.counter += 1

    def _verify(self, body: memoryview) -> memoryview:
        stream = self._in
        assert stream is not None, "no incoming stream before the handshake"
        if len(body) < ENVELOPE.size or body[0] != MARK:
            raise FrameRefused(AUTH_FAILED, "unauthenticated", "no authentication envelope (plain or truncated)")
        _, counter, tag = ENVELOPE.unpack_from(body)
        content = body[ENVELOPE.size :]
        # The tag is checked first, over the counter the frame claims: a good tag with the wrong
        # counter can only be a genuine frame of this connection sent again.
        if not hmac.compare_digest(tag, stream.tag(counter, (content,))):
            raise FrameRefused(
                AUTH_FAILED, "bad_mac", "bad MAC: a wrong key, a changed frame, or one from another connection"
            )
        if counter != stream.counter:
            raise FrameRefused(
                AUTH_FAILED, "replayed", f"replayed or reordered frame: counter {counter}, expected {stream.counter}"
            )
        stream.counter += 1
        return content


def _nonce(message: Any) -> bytes | None:
    nonce = message.get("nonce") if isinstance(message, dict) else None
    return bytes(nonce) if isinstance(nonce, memoryview) and len(nonce) == NONCE_BYTES else None


class HostAuth(FrameAuth):
    """The host's side: challenge at connect, then verify the device's auth frame, then everything."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self._in = _Stream(key, SENT_BY_DEVICE + self.nonce)

    def greeting(self) -> dict[str, Any]:
        return {"op": "challenge", "auth": SCHEME, "nonce": self.nonce}

    def open(self, body: memoryview) -> memoryview | None:
        if not body or body[0] != MARK:
            # Not read any further: a peer without the key gets this sentence and nothing else.
            raise FrameRefused(
                "this host requires authenticated frames: give the device the host's key (split-device --key-file)",
                "unauthenticated", "a plain frame: the peer has no key",
            )
        content = self._verify(body)
        if self._out is not None:
            return content
        try:
            message = unpack(content)
        except ProtocolError:
            message = None
        device_nonce = _nonce(message) if isinstance(message, dict) and message.get("op") == "auth" else None
        if device_nonce is None:
            raise FrameRefused(AUTH_FAILED, "handshake", "the first frame must be {op: auth, nonce: 16 bytes}")
        self._out = _Stream(self._key, SENT_BY_HOST + self.nonce + device_nonce)
        return None


class DeviceAuth(FrameAuth):
    """The device's side: take the host's challenge, answer with :meth:`auth_message`, then everything."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key)
        self.nonce = secrets.token_bytes(NONCE_BYTES)

    def auth_message(self) -> dict[str, Any]:
        """The first frame to send, sealed, as soon as :meth:`open` has taken the challenge."""
        return {"op": "auth", "nonce": self.nonce}

    def open(self, body: memoryview) -> memoryview | None:
        if self._in is not None and body and body[0] == MARK:
            return self._verify(body)
        # Plain frames: the challenge (first) or the host's refusal (its last frame); nothing else.
        message: Any = None
        if len(body) <= MAX_PLAIN_BYTES:
            try:
                message = unpack(body)
            except ProtocolError:
                pass
        if not isinstance(message, dict):
            raise FrameRefused("sent a frame that is not authenticated", "unauthenticated")
        if self._in is None and message.get("op") == "challenge":
            host_nonce = _nonce(message)
            if host_nonce is None or message.get("auth") != SCHEME:
                raise FrameRefused(f"sent a challenge this device cannot answer ({SCHEME} expected)", "handshake")
            self._out = _Stream(self._key, SENT_BY_DEVICE + host_nonce)
            self._in = _Stream(self._key, SENT_BY_HOST + host_nonce + self.nonce)
            return None
        error = message.get("error")
        if message.get("ok") is False and isinstance(error, dict) and error.get("code") == ErrorCode.UNAUTHORIZED:
            hint = " (the device's --key-file must hold the host's key)" if error.get("message") == AUTH_FAILED else ""
            raise FrameRefused(f"refused this device: {error.get('message')}{hint}", "refused_by_host")
        if message.get("ok") is False and isinstance(error, dict) and error.get("code") == ErrorCode.OVERLOADED:
            # Before any handshake a host past its connection limits says so in the clear.
            raise FrameRefused(f"{error.get('message')}; try another host or later", "refused_by_host")
        raise FrameRefused("sent a frame that is not authenticated", "unauthenticated")
