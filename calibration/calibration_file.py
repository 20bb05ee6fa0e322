"""``calibration.json``: one board's measured latency model and split table, stored beside a bundle.

Timings only hold for the bundle they were measured on, so the file names the bundle and the
sha256 of its manifest, and :func:`load` refuses it for any other. The reader checks every
field by hand, naming it by its path, because this package depends on numpy and the
standard library only (no jsonschema on the board).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from calibration.latency import LatencyModel
from calibration.table import SplitTable
from splitedge.errors import CalibrationError
from splitedge.fields import Fields, join, shown
from splitedge.words import FORMATS, PRECISIONS

_fields = Fields(CalibrationError)  # field checks raising this package's error

SCHEMA = "splitedge.calibration/1"
FILENAME = "calibration.json"
LINK_FIELDS = ("rtt_ms", "probe_bytes", "probe_ms", "rate_bps")

_SCHEMA_NAME, _SCHEMA_VERSION = SCHEMA.rsplit("/", 1)
# Taken from the JSON as they are and checked by Calibration.__post_init__; the rest is unpacked first.
_PLAIN_FIELDS = (
    "bundle_id", "manifest_sha256", "created", "board", "backend", "precision", "threads", "repeats", "link"
)
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Calibration:
    """What ``split-device calibrate`` measured for one bundle on one board."""

    bundle_id: str
    manifest_sha256: str
    created: str  # ISO 8601 UTC
    board: dict[str, Any]  # what the board runtime reports (free-form)
    backend: str  # one of FORMATS: the artifacts' format timed
    precision: str  # one of PRECISIONS
    threads: int | None
    repeats: int
    batches: tuple[int, ...]
    link: dict[str, float] | None  # LINK_FIELDS, or None when calibrated without a host
    model: LatencyModel
    table: SplitTable
    fps: float = 0.0  # the pace of the board's timed runs (0: back to back), see measure_ms

    def __post_init__(self) -> None:
        _fields.text(self.bundle_id, "bundle_id")
        if not isinstance(self.manifest_sha256, str) or not _SHA256.fullmatch(self.manifest_sha256):
            got = shown(self.manifest_sha256)
            raise CalibrationError(f"manifest_sha256: expected 64 lowercase hex digits, got {got}")
        _check_utc(self.created, "created")
        object.__setattr__(self, "board", dict(_fields.obj(self.board, "board")))
        _fields.choice(self.backend, "backend", FORMATS)
        _fields.choice(self.precision, "precision", PRECISIONS)
        if self.threads is not None:
            _fields.integer(self.threads, "threads", minimum=1)
        _fields.integer(self.repeats, "repeats", minimum=1)
        object.__setattr__(self, "fps", _fields.number(self.fps, "fps"))
        batches = tuple(_fields.integer(b, f"batches[{i}]", minimum=1) for i, b in enumerate(self.batches))
        if not batches or list(batches) != sorted(set(batches)):
            raise CalibrationError(f"batches: expected ascending batch sizes, at least one, got {list(batches)}")
        object.__setattr__(self, "batches", batches)
        if self.link is not None:
            raw = _fields.obj(self.link, "link")
            link = {key: _fields.number(_fields.member(raw, key, "link"), f"link.{key}") for key in LINK_FIELDS}
            object.__setattr__(self, "link", link)
        unknown = [s for s in self.table.splits if s not in self.model.names]
        if unknown:
            # The selector predicts the table's choices with the model: each must be in it.
            known = ", ".join(self.model.names)
            raise CalibrationError(f"table.splits: {', '.join(unknown)} not in the model's splits ({known})")

    def to_dict(self) -> dict[str, Any]:
        """The file's content, led by the schema it is written in."""
        return {
            "schema": SCHEMA,
            "bundle_id": self.bundle_id,
            "manifest_sha256": self.manifest_sha256,
            "created": self.created,
            "board": self.board,
            "backend": self.backend,
            "precision": self.precision,
            "threads": self.threads,
            "repeats": self.repeats,
            "fps": self.fps,
            "batches": list(self.batches),
            "link": self.link,
            "model": self.model.to_dict(),
            "table": self.table.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = FILENAME) -> Calibration:
        """Read :meth:`to_dict`'s output; errors start with ``source`` and name the field."""
        root = f"{source}:"
        d = _fields.obj(d, source)
        _check_schema(_fields.member(d, "schema", root), source)
        args = {key: _fields.member(d, key, root) for key in _PLAIN_FIELDS}
        args["fps"] = d.get("fps", 0.0)  # files written before runs were paced: back to back
        args["batches"] = _fields.array(_fields.member(d, "batches", root), join(root, "batches"))
        args["model"] = LatencyModel.from_dict(_fields.member(d, "model", root), join(root, "model"))
        args["table"] = SplitTable.from_dict(_fields.member(d, "table", root), join(root, "table"))
        with _fields.located(root):
            return cls(**args)


def save(calibration: Calibration, path: str | Path) -> None:
    """Write ``calibration`` to ``path`` atomically: a reader sees the old file or the new one.

    The device may be switched off mid-write (a Pi loses power by its plug); a half-written
    calibration.json would refuse to load and the board would run without a table.
    """
    path = Path(path)
    text = json.dumps(calibration.to_dict(), indent=2) + "\n"  # fails before any file is touched
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())  # the data reaches the card before the rename does
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load(path: str | Path, bundle_id: str | None = None, manifest_sha256: str | None = None) -> Calibration:
    """Read and check a calibration file (``path``: the file, or the bundle directory holding it).

    With ``bundle_id`` / ``manifest_sha256``, a calibration of another bundle (or of another
    export under the same id) is refused: its timings describe different networks.
    """
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CalibrationError(
            f"no calibration for this bundle at {path}; run split-device calibrate {path.parent}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CalibrationError(f"{path}: cannot read the calibration: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path}: not valid JSON: {exc}") from exc
    calibration = Calibration.from_dict(data, source=str(path))
    if (bundle_id is not None and bundle_id != calibration.bundle_id) or (
        manifest_sha256 is not None and manifest_sha256 != calibration.manifest_sha256
    ):
        wanted = bundle_id if bundle_id is not None else calibration.bundle_id
        if manifest_sha256 is not None:
            wanted += f" (manifest sha256 {manifest_sha256[:12]}…)"
        raise CalibrationError(
            f"{path} was calibrated for bundle {calibration.bundle_id} "
            f"(manifest sha256 {calibration.manifest_sha256[:12]}…), not for {wanted}; "
            "run split-device calibrate again"
        )
    return calibration


def _check_schema(schema: Any, source: str) -> None:
    name, _, version = schema.rpartition("/") if isinstance(schema, str) else ("", "", "")
    if name == _SCHEMA_NAME and version.isdecimal() and int(version) > int(_SCHEMA_VERSION):
        raise CalibrationError(
            f"{source}: schema {schema} is newer than this splitedge reads ({SCHEMA}); "
            "upgrade splitedge on this board, or run split-device calibrate again"
        )
    if schema != SCHEMA:
        raise CalibrationError(f"{source}: schema: expected {SCHEMA}, got {shown(schema)}")


def _check_utc(value: Any, path: str) -> None:
    """ISO 8601 with a zero UTC offset, such as 2025-05-01T12:00:00+00:00 or ...Z."""
    try:
        # Python 3.10's fromisoformat does not read "Z"; boards run 3.11 or 3.13, the host may not.
        stamp = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except (TypeError, ValueError, AttributeError):
        stamp = None
    if stamp is None or stamp.utcoffset() != timedelta(0):
        example = "2025-05-01T12:00:00+00:00"
        raise CalibrationError(f"{path}: expected an ISO 8601 UTC time such as {example}, got {shown(value)}")
