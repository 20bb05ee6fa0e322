"""One exception hierarchy for every part of splitedge, defined once, here at the bottom.

Standard library only, so ``calibration`` and ``boards`` (which import nothing else of the
project) raise the same family as the runtimes. Lower-level errors (onnxruntime, socket,
msgpack, torch.onnx) are converted where they enter the project with ``raise ... from exc``
so that callers catch one family.
"""

from __future__ import annotations


__all__ = [
    "AuthenticationError", "BackendError", "BoardFitError", "BundleError", "CalibrationError", "CameraError",
    "ConfigError", "CredentialsError", "CutPointError", "DeployError", "ExportError", "FrameRefused",
    "HostUnavailableError", "ModelSpecError", "ProtocolError", "RemoteError", "SplitEdgeError", "ValidationError",
    "brief",
]

class SplitEdgeError(Exception):
    """Base of every error splitedge raises on purpose."""


def brief(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of a library's exception, for a one-line error: torch.onnx puts a
    300-line TorchScript graph in its messages and JAX its own trace; the whole chain is what a
    command's ``--debug`` prints."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > limit:
        text = text[:limit - 1] + "…"
    more = f" (+{len(lines) - 1} more lines: --debug shows them)" if len(lines) > 1 else ""
    return f"{type(exc).__name__}: {text}{more}"


class BundleError(SplitEdgeError):
    """A bundle is corrupt, incomplete or from an incompatible version; the message names the file or field."""


class ProtocolError(SplitEdgeError):
    """A frame broke the wire protocol. ``code`` is the typed error sent back to the peer."""

    def __init__(self, message: str, code: str = "bad_request", request_id: object = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id  # set when the frame parsed far enough to have one


class RemoteError(SplitEdgeError):
    """The host answered a request with a typed error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class HostUnavailableError(SplitEdgeError):
    """No host could be found, reached, or it went away with requests in flight."""


class AuthenticationError(HostUnavailableError):
    """The host and this device could not authenticate each other: a missing or wrong key, a refused
    frame, or an untrusted TLS certificate. A subclass of :class:`HostUnavailableError` because, to
    the device, such a host is one it cannot use; the message says which credential to fix."""


class FrameRefused(ProtocolError):
    """A frame failed authentication (code ``unauthorized``). ``str()`` is what the peer is told,
    the same whatever went wrong; ``kind`` and ``reason`` say what did, for the log and the stats."""

    def __init__(self, message: str, kind: str, reason: str | None = None) -> None:
        super().__init__(message, code="unauthorized")
        self.kind = kind  # unauthenticated | bad_mac | replayed | handshake | refused_by_host
        self.reason = reason or message


class CredentialsError(SplitEdgeError):
    """A key file, certificate or private key cannot be used; the message names the file and the problem."""


class CameraError(SplitEdgeError):
    """A frame source cannot be opened or stopped delivering frames."""


class BackendError(SplitEdgeError):
    """An inference backend could not load or run an artifact (wrong shape, missing runtime...)."""


class ModelSpecError(SplitEdgeError):
    """A model could not be loaded from its ``torchvision:NAME`` or ``module:factory`` spec."""


class CutPointError(SplitEdgeError):
    """A requested cut point does not exist or is not a valid cut of the graph."""


class ExportError(SplitEdgeError):
    """A model could not be exported to an artifact format (the exporter failed, or the file could not be written)."""


class BoardFitError(SplitEdgeError):
    """A bundle's artifacts would not fit the memory of the board it is built for (or the board is
    unknown); ``report`` holds the estimate (a ``boards.FitReport``) where one was made."""

    def __init__(self, message: str, report: object = None) -> None:
        super().__init__(message)
        self.report = report


class CalibrationError(SplitEdgeError, ValueError):
    """Timings, a table or a calibration file are unusable; the message names the file, the field,
    what was expected and what was found. Also a ``ValueError``: bad timings, a bad file, an
    unknown split are bad values."""


class ValidationError(SplitEdgeError):
    """An exported artifact does not reproduce its reference; the message lists every mismatch."""


class ConfigError(SplitEdgeError):
    """A settings file or variable cannot be used: the message names the file (or variable), the key,
    what was expected and what was found."""


class DeployError(SplitEdgeError):
    """One board's deploy failed; the message names the board, why, and what to do."""

    def __init__(self, board: str, reason: str) -> None:
        super().__init__(f"{board}: {reason}")
        self.board = board
        self.reason = reason
