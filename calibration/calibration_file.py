"""``calibration.json``: one board's measured latency models and split tables, stored beside a bundle.

Timings only hold for the bundle they were measured on, so the file names the bundle and the
sha256 of its manifest, and :func:`load` refuses it for any other. They also only hold for
the runtime and precision that ran the heads (an int8 ONNX head and a float32 TFLite head of
the same cut can differ by 3x), so the file holds one :class:`Calibration` per (backend,
precision): calibrating another backend adds a table and keeps the others (:func:`save`),
and ``split-device run`` takes the table of what it runs. The reader checks every field by
hand, naming it by its path, because this package depends on numpy and the standard library
only (no jsonschema on the board).

Schema 2 holds the list of tables and each table's spread (p10/p50/p90 of every timed
option); schema 1 files (one table, no spread) are still read, as a list of one: their
medians are as good as they were, and a board upgraded in the field keeps choosing its
splits instead of falling back to a fixed cut until someone calibrates it again. A table also
says how the board's preprocessing was timed (:class:`Preprocessing`: the path, the frame size,
the spread; the median is the model's ``preprocess_ms``); a table written before it was timed
has none, and its model counts preprocessing as 0 (what it always did), which every place
that shows the model says.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from calibration._latency import LatencyModel, _batch_key
from calibration._table import SplitTable
from calibration._timing import Spread
from splitedge import FORMATS, Fields, PRECISIONS, join, shown, write_atomically
from splitedge.errors import CalibrationError
from splitedge.reading import read_text_bounded

__all__ = ["FILENAME", "SCHEMA", "Calibration", "Calibrations", "Preprocessing", "load", "load_all", "save"]

_fields = Fields(CalibrationError)  # field checks raising this package's error

SCHEMA = "splitedge.calibration/2"
FILENAME = "calibration.json"
#: The largest calibration file read: a board's holds a few tables of a few KB each.
MAX_FILE_BYTES = 64 << 20
LINK_FIELDS = ("rtt_ms", "probe_bytes", "probe_ms", "rate_bps")
#: Link timings that may carry a spread (the rate is a slope of medians: it has none of its own).
LINK_SPREAD_FIELDS = ("rtt_ms", "probe_ms")

_SCHEMA_NAME, _SCHEMA_VERSION = SCHEMA.rsplit("/", 1)
_SCHEMA_1 = f"{_SCHEMA_NAME}/1"  # one table, no spread: read as a list of one
# Taken from the JSON as they are and checked by Calibration.__post_init__; the rest is unpacked first.
_PLAIN_FIELDS = (
    "bundle_id", "manifest_sha256", "created", "board", "backend", "precision", "threads", "repeats", "link"
)

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Preprocessing:
    """How ``split-device calibrate`` timed the board's preprocessing: one camera frame of
    ``width`` x ``height`` made the model's input by ``path`` (``exact`` or ``fast``, what the
    run's ``--preprocess`` came to), p10/p50/p90 over the repeats; p50 is the model's
    ``preprocess_ms``. The cost grows with the frame (a resize reads every pixel), so it only
    holds for a camera of that size."""

    path: str
    width: int
    height: int
    spread: Spread

    def __post_init__(self) -> None:
        _fields.text(self.path, "path")
        _fields.integer(self.width, "width", minimum=1)
        _fields.integer(self.height, "height", minimum=1)
        if not isinstance(self.spread, Spread):
            raise CalibrationError(f"spread: expected a Spread, got {shown(self.spread)}")

    @property
    def frame(self) -> str:
        """``640x480``: the frame size, as ``--frame`` takes it."""
        return f"{self.width}x{self.height}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "width": self.width, "height": self.height, "spread": self.spread.to_dict()}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Preprocessing:
        """Read :meth:`to_dict`'s output; errors name the field under ``where``."""
        d = _fields.obj(d, where)
        args = {name: _fields.member(d, name, where) for name in ("path", "width", "height")}
        spread = Spread.from_dict(_fields.member(d, "spread", where), join(where, "spread"))
        with _fields.located(where):
            return cls(spread=spread, **args)


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
    # p10/p50/p90 of every head (split -> batch -> spread; p50 is the model's head_ms) and of
    # the link's pings (LINK_SPREAD_FIELDS); empty in files written before spreads were kept.
    head_spread: dict[str, dict[int, Spread]] = field(default_factory=dict)
    link_spread: dict[str, Spread] = field(default_factory=dict)
    # Each chain's placement beyond the host it enters (calibration.chains.place): the addresses
    # (host:port) of the hosts of its stages 2..n; absent for a chain all on one host.
    routes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # How preprocessing was timed (its median is model.preprocess_ms); None in files written before.
    preprocess: Preprocessing | None = None

    @property
    def key(self) -> tuple[str, str]:
        """(backend, precision): what ran the heads, the key of this table in the file."""
        return (self.backend, self.precision)

    def __post_init__(self) -> None:
        _check_identity(self.bundle_id, self.manifest_sha256)
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
        heads = {}
        # Every head timed, the model's options or not (without a host, only local is one).
        for split, by_batch in _fields.obj(self.head_spread, "spread.heads").items():
            for batch, spread in _fields.obj(by_batch, f"spread.heads.{split}").items():
                _fields.integer(batch, f"spread.heads.{split}[{batch!r}]", minimum=1)
                if not isinstance(spread, Spread):
                    raise CalibrationError(f"spread.heads.{split}[{batch}]: expected a Spread, got {shown(spread)}")
            heads[split] = dict(by_batch)
        object.__setattr__(self, "head_spread", heads)
        link_spread = dict(_fields.obj(self.link_spread, "spread.link"))
        for name, spread in link_spread.items():
            _fields.choice(name, "spread.link", LINK_SPREAD_FIELDS)
            if not isinstance(spread, Spread):
                raise CalibrationError(f"spread.link.{name}: expected a Spread, got {shown(spread)}")
        object.__setattr__(self, "link_spread", link_spread)
        routes = {}
        for chain, hosts in _fields.obj(self.routes, "routes").items():
            if chain not in self.model.names:
                raise CalibrationError(f"routes.{chain}: not a split of the model ({', '.join(self.model.names)})")
            path = f"routes.{chain}"
            routes[chain] = tuple(_fields.text(h, f"{path}[{i}]") for i, h in enumerate(_fields.array(hosts, path)))
        object.__setattr__(self, "routes", routes)
        timed = None if self.preprocess is None else self.preprocess.spread.p50
        if timed != self.model.preprocess_ms:
            # One figure in two places: the model predicts with the one the spread describes.
            raise CalibrationError(f"model.preprocess_ms: expected the preprocessing's median ({timed!r}), "
                                   f"got {self.model.preprocess_ms!r}")
        unknown = [s for s in self.table.splits if s not in self.model.names]
        if unknown:
            # The selector predicts the table's choices with the model: each must be in it.
            known = ", ".join(self.model.names)
            raise CalibrationError(f"table.splits: {', '.join(unknown)} not in the model's splits ({known})")

    def to_dict(self) -> dict[str, Any]:
        """One table of the file (:class:`Calibrations` writes the list, under the schema)."""
        return {
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
            "spread": {
                "heads": {
                    split: {str(b): s.to_dict() for b, s in sorted(by_batch.items())}
                    for split, by_batch in self.head_spread.items()
                },
                "link": {name: s.to_dict() for name, s in self.link_spread.items()},
            },
            "routes": {chain: list(hosts) for chain, hosts in self.routes.items()},
            **({} if self.preprocess is None else {"preprocess": self.preprocess.to_dict()}),
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = FILENAME, where: str | None = None) -> Calibration:
        """Read :meth:`to_dict`'s output; errors start with ``source`` and name the field, under
        ``where`` when the table sits inside the file (``calibration.json: calibrations[1]``)."""
        root = f"{source}:" if where is None else where
        d = _fields.obj(d, root.rstrip(":"))
        args = {key: _fields.member(d, key, root) for key in _PLAIN_FIELDS}
        args["fps"] = d.get("fps", 0.0)  # files written before runs were paced: back to back
        args["batches"] = _fields.array(_fields.member(d, "batches", root), join(root, "batches"))
        args["model"] = LatencyModel.from_dict(_fields.member(d, "model", root), join(root, "model"))
        args["table"] = SplitTable.from_dict(_fields.member(d, "table", root), join(root, "table"))
        args["head_spread"], args["link_spread"] = _read_spread(d.get("spread"), join(root, "spread"))
        args["routes"] = d.get("routes", {})  # files written before chains: none
        raw = d.get("preprocess")  # files written before preprocessing was timed: none
        args["preprocess"] = None if raw is None else Preprocessing.from_dict(raw, join(root, "preprocess"))
        with _fields.located(root):
            return cls(**args)


def _read_spread(d: Any, where: str) -> tuple[dict[str, dict[int, Spread]], dict[str, Spread]]:
    """``spread`` of one table (absent in schema 1: no spreads)."""
    if d is None:
        return {}, {}
    d = _fields.obj(d, where)
    heads_path, link_path = join(where, "heads"), join(where, "link")
    heads = {
        split: {
            _batch_key(b, f"{heads_path}.{split}[{b!r}]"): Spread.from_dict(s, f"{heads_path}.{split}[{b}]")
            for b, s in _fields.obj(by_batch, f"{heads_path}.{split}").items()
        }
        for split, by_batch in _fields.obj(d.get("heads", {}), heads_path).items()
    }
    link = {name: Spread.from_dict(s, f"{link_path}.{name}") for name, s in _fields.obj(d.get("link", {}), link_path).items()}
    return heads, link


def _key_text(key: tuple[str, str]) -> str:
    return "/".join(key)


@dataclass(frozen=True)
class Calibrations:
    """Every table of one bundle's ``calibration.json``: one :class:`Calibration` per (backend, precision)."""

    bundle_id: str
    manifest_sha256: str
    tables: tuple[Calibration, ...]  # unique keys, in the order written (a recalibrated key keeps its place)

    def __post_init__(self) -> None:
        _check_identity(self.bundle_id, self.manifest_sha256)
        tables = tuple(self.tables)
        if not tables:
            raise CalibrationError("calibrations: expected at least one table, got none")
        seen = set()
        for i, table in enumerate(tables):
            if (table.bundle_id, table.manifest_sha256) != (self.bundle_id, self.manifest_sha256):
                raise CalibrationError(
                    f"calibrations[{i}]: measured for bundle {table.bundle_id}, the file is for {self.bundle_id}"
                )
            if table.key in seen:
                raise CalibrationError(f"calibrations[{i}]: a second table for {_key_text(table.key)}")
            seen.add(table.key)
        object.__setattr__(self, "tables", tables)

    @property
    def keys(self) -> tuple[tuple[str, str], ...]:
        """The (backend, precision) of every table, in file order."""
        return tuple(t.key for t in self.tables)

    def describe(self) -> str:
        """``onnx/int8, tflite/float32``: the tables, for messages."""
        return ", ".join(_key_text(k) for k in self.keys)

    def get(self, backend: str, precision: str) -> Calibration | None:
        """The table measured with ``backend`` at ``precision``, or None."""
        return next((t for t in self.tables if t.key == (backend, precision)), None)

    def latest(self) -> Calibration:
        """The table calibrated last (the last listed among equal times)."""
        return max(reversed(self.tables), key=lambda t: _utc(t.created))

    def nearest(self, backend: str, precision: str) -> Calibration:
        """The table closest to (``backend``, ``precision``) when there is none for it: the same
        backend (a runtime's speed differs more between runtimes than between precisions of one),
        else the same precision, else the latest. Exact when there is one."""
        for match in (lambda t: t.key == (backend, precision), lambda t: t.backend == backend,
                      lambda t: t.precision == precision):
            found = [t for t in self.tables if match(t)]
            if found:
                return max(reversed(found), key=lambda t: _utc(t.created))
        return self.latest()

    def with_table(self, calibration: Calibration) -> Calibrations:
        """These tables with ``calibration`` in place of the one of its key (appended when new)."""
        if calibration.key in self.keys:
            tables = tuple(calibration if t.key == calibration.key else t for t in self.tables)
        else:
            tables = (*self.tables, calibration)
        return Calibrations(self.bundle_id, self.manifest_sha256, tables)

    def to_dict(self) -> dict[str, Any]:
        """The file's content, led by the schema it is written in; the bundle's identity once."""
        return {
            "schema": SCHEMA,
            "bundle_id": self.bundle_id,
            "manifest_sha256": self.manifest_sha256,
            "calibrations": [
                {k: v for k, v in t.to_dict().items() if k not in ("bundle_id", "manifest_sha256")}
                for t in self.tables
            ],
        }

    @classmethod
    def from_dict(cls, d: Any, source: str = FILENAME) -> Calibrations:
        """Read :meth:`to_dict`'s output, or a schema 1 file (one table); errors start with ``source``."""
        root = f"{source}:"
        d = _fields.obj(d, source)
        schema = _fields.member(d, "schema", root)
        _check_schema(schema, source)
        if schema == _SCHEMA_1:
            table = Calibration.from_dict(d, source)
            return cls(table.bundle_id, table.manifest_sha256, (table,))
        identity = {key: _fields.member(d, key, root) for key in ("bundle_id", "manifest_sha256")}
        with _fields.located(root):  # named at the top, where they are, not in the first table
            _check_identity(**identity)
        path = join(root, "calibrations")
        raw = _fields.array(_fields.member(d, "calibrations", root), path)
        tables = tuple(
            Calibration.from_dict({**_fields.obj(t, f"{path}[{i}]"), **identity}, source, f"{path}[{i}]")
            for i, t in enumerate(raw)
        )
        with _fields.located(root):
            return cls(tables=tables, **identity)


def save(calibration: Calibration, path: str | Path) -> Calibrations:
    """Write ``calibration`` into ``path`` atomically (a reader sees the old file or the new one)
    and return the tables the file now holds.

    The file keeps its tables of other (backend, precision) pairs when it is this bundle's (the
    same id and manifest) and readable; a table of the same pair is replaced. Anything else
    there (another bundle's timings, a file this version cannot read) is replaced whole: it
    could not be used with this bundle anyway. The device may be switched off mid-write (a Pi
    loses power by its plug); a half-written calibration.json would refuse to load and the
    board would run without a table.
    """
    path = Path(path)
    try:
        tables = load_all(path, calibration.bundle_id, calibration.manifest_sha256).with_table(calibration)
    except CalibrationError:  # none yet, another bundle's, or unreadable
        tables = Calibrations(calibration.bundle_id, calibration.manifest_sha256, (calibration,))
    write_atomically(path, json.dumps(tables.to_dict(), indent=2) + "\n")  # the JSON fails before any file is touched
    return tables


def load(
    path: str | Path, bundle_id: str | None = None, manifest_sha256: str | None = None,
    backend: str | None = None, precision: str | None = None,
) -> Calibration:
    """One table of a calibration file (``path``: the file, or the bundle directory holding it).

    With ``backend`` and ``precision``, the table measured so, else an error naming the tables
    there and the command that measures the one asked for; without them, the latest table.
    ``bundle_id`` / ``manifest_sha256`` are checked as by :func:`load_all`.
    """
    tables = load_all(path, bundle_id, manifest_sha256)
    if backend is None and precision is None:
        return tables.latest()
    found = [t for t in tables.tables if backend in (None, t.backend) and precision in (None, t.precision)]
    if not found:
        path = Path(path) / FILENAME if Path(path).is_dir() else Path(path)
        wanted = " ".join(f"--{name} {value}" for name, value in (("backend", backend), ("precision", precision))
                          if value is not None)
        raise CalibrationError(
            f"{path} has no table for {_key_text((backend or 'any', precision or 'any'))} "
            f"(it has {tables.describe()}); run split-device calibrate {path.parent} {wanted}"
        )
    return max(reversed(found), key=lambda t: _utc(t.created))


def load_all(path: str | Path, bundle_id: str | None = None, manifest_sha256: str | None = None) -> Calibrations:
    """Read and check every table of a calibration file (``path``: the file, or the bundle directory).

    With ``bundle_id`` / ``manifest_sha256``, a calibration of another bundle (or of another
    export under the same id) is refused: its timings describe different networks.
    """
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    try:
        text = read_text_bounded(path, MAX_FILE_BYTES)  # a path a trace names may be a FIFO or /dev/zero
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
    calibration = Calibrations.from_dict(data, source=str(path))
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
    if schema not in (SCHEMA, _SCHEMA_1):
        raise CalibrationError(f"{source}: schema: expected {SCHEMA}, got {shown(schema)}")


def _check_identity(bundle_id: Any, manifest_sha256: Any) -> None:
    _fields.text(bundle_id, "bundle_id")
    if not isinstance(manifest_sha256, str) or not _SHA256.fullmatch(manifest_sha256):
        raise CalibrationError(f"manifest_sha256: expected 64 lowercase hex digits, got {shown(manifest_sha256)}")


def _utc(value: str) -> datetime | None:
    """An ISO 8601 UTC time, such as 2025-05-01T12:00:00+00:00 or ...Z; None if it is not one."""
    try:
        # Python 3.10's fromisoformat does not read "Z"; boards run 3.11 or 3.13, the host may not.
        stamp = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except (TypeError, ValueError, AttributeError):
        return None
    return stamp if stamp.utcoffset() == timedelta(0) else None


def _check_utc(value: Any, path: str) -> None:
    """ISO 8601 with a zero UTC offset, such as 2025-05-01T12:00:00+00:00 or ...Z."""
    stamp = _utc(value)
    if stamp is None:
        example = "2025-05-01T12:00:00+00:00"
        raise CalibrationError(f"{path}: expected an ISO 8601 UTC time such as {example}, got {shown(value)}")
