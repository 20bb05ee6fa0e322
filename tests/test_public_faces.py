"""Each package's ``__init__.py`` is its public face: ``__all__`` pinned here, every name real,
and code outside a package imports it only through that face, or through a public sub-face
listed here (``device_runtime.wire.ops``: a group that belongs together, with its own ``__all__``,
as ``zeroconf.asyncio`` is zeroconf's).

A name added to or dropped from a face is a change to what users import; it should be made
here on purpose, not by accident (``boards`` pins its own in its tests).
A package's other modules are its own business, and in the packages listed in ``PRIVATE`` their
names say so (``device_runtime/wire/_framing.py``): code in another package that imports one of
them (``from device_runtime.wire._framing import ...``) is refused below, so they can change
freely. No face exports more than :data:`MAX_NAMES` names. Tests may import private modules.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

FACES = {
    "splitedge": [
        "Bounds", "FLOAT32", "FORMATS", "Fields", "INT8", "LOCAL", "OFFLOAD", "ONNX", "PRECISIONS", "SettingError",
        "SplitEdgeError", "TFLITE", "as_flag_type", "bounds_of", "join", "shown", "write_atomically",
    ],
    "splitedge.errors": [
        "AuthenticationError", "BackendError", "BoardFitError", "BundleError", "CalibrationError", "CameraError",
        "ConfigError", "CredentialsError", "CutPointError", "DeployError", "ExportError", "FrameRefused",
        "HostUnavailableError", "ModelSpecError", "ProtocolError", "RemoteError", "SplitEdgeError", "ValidationError",
        "brief",
    ],
    "splitedge.reading": [
        "FRAME", "HEAD_TIMES", "LINK_RATE", "MAX_LINE_BYTES", "NotReadable", "RUN", "add_report_arguments", "file_kind",
        "read_bounded", "read_text_bounded", "trace_json", "trace_lines", "trace_records",
    ],
    "splitedge.lifecycle": [
        "SIGNAL_EXIT", "Runner", "Stopped", "exit_on_signals", "notify", "run_command", "signals_held", "stop_on_signals",
    ],
    "splitedge.units": [
        "SYSTEMD_RUNNING", "UNIT_DIR", "Credential", "ServiceUnit", "enable_offline", "enable_unit", "exec_line",
        "needs_home", "write_unit",
    ],
    "calibration": [
        "CalibrationError", "Decision", "LatencyModel", "MIN_SAMPLE_BYTES", "POINTS_PER_DECADE", "RATE_MAX_BPS",
        "RATE_MIN_BPS", "RateEstimator", "RunningTimes", "SplitSelector", "SplitTable", "SplitTimings", "Spread",
        "WIDE_MIN_MS", "WIDE_RATIO", "decision_cost_us", "drop_share", "gains_over_static", "measure_ms",
        "measure_round_robin", "relative_gain", "widest",
    ],
    "calibration.calibration_file": [
        "FILENAME", "SCHEMA", "Calibration", "Calibrations", "Preprocessing", "load", "load_all", "save",
    ],
    "calibration.chains": ["MAX_PLACEMENTS", "ChainStage", "HostView", "Placement", "chain_timings", "place"],
    "calibration.fragments": [
        "FragmentPlacement", "fragment_names", "place_fragments", "semantic_cost_ms", "semantic_timings", "unserved",
    ],
    "calibration.bandit": [
        "ARMS", "BANDIT_FILENAME", "BANDIT_SCHEMA", "CONTEXTS", "HIGH", "LAYER", "LEARN", "LOW", "MODES", "RUN",
        "SEMANTIC", "ArmStats", "Bandit", "reward",
    ],
    "device_runtime": [
        "Artifact", "Bundle", "Exit", "FULL", "Fragment", "HEAD", "LOCAL", "Manifest", "ModelInfo", "OFFLOAD", "Preprocess",
        "Quantization", "Split", "Stage", "TAIL", "TensorSpec", "artifacts_of", "check_name", "make_artifact",
        "semantic_id", "slice_bundle", "stage_id", "write_manifest",
    ],
    "device_runtime.bundle": [
        "BOARD_PART", "BOTTLENECK", "CHAIN", "CHAIN_JOIN", "CUT", "CUT_BITS", "Coding", "FLOAT32", "FORMATS", "FULL", "HEAD",
        "INT8", "IO_NAMES",
        "LAYER", "LOCAL", "LOGITS", "MIDDLE_STAGE_IO", "OFFLOAD", "ONNX", "PARTS", "PRECISIONS", "SEMANTIC", "TAIL", "TFLITE",
        "artifacts_of", "check_name", "make_artifact", "semantic_id", "stage_id", "write_manifest",
    ],
    "device_runtime.wire": [
        "DEFAULT_MAX_FRAME_BYTES", "DecodeLimits", "DeviceAuth", "ErrorCode", "FrameAuth", "FrameBudget", "FrameDecoder",
        "FramedProtocol", "HostAuth", "Oversized", "PROTOCOL_VERSION", "REFUSAL_KINDS", "REPLY_LIMITS", "REQUEST_LIMITS",
        "accept_tls", "affine_params", "client_context", "decode", "decode_tensor", "dequantize", "encode", "encode_bytes",
        "encode_message", "load_key", "quantize", "server_context",
    ],
    "device_runtime.wire.coding": ["MIN_CHANNEL_VALUES", "CodedCut", "CutCoding", "coding_bits", "pack_bits", "packed_bytes", "unpack_bits"],
    "device_runtime.wire.txt": [
        "MAX_BUNDLES", "SERVICE_TYPE", "TxtRecord", "open_zeroconf", "parse_txt", "txt_record",
    ],
    "device_runtime.wire.ops": [
        "DEFAULT_LINK_BYTES", "ERROR_CODES", "MAX_LINKS_REQUEST_BYTES", "MAX_PROFILE_REPEATS", "MAX_ROUTE_HOPS",
        "OPS", "REPLIES", "REQUESTS", "ErrorReply", "HelloReply", "HelloRequest", "Hop", "HopTiming",
        "InferReply", "InferRequest", "LinksReply", "LinksRequest", "PingReply", "PingRequest", "ProfileReply",
        "ProfileRequest", "Quantization", "Reply", "Request", "StatsReply", "StatsRequest", "error_reply",
        "parse_reply", "parse_request", "split_address",
    ],
    "device_runtime.link": [
        "ClientPool", "Credentials", "Deadline", "HostClient", "InferResult", "KernelTimingSupport", "Leg", "Probe",
        "UploadTiming", "kernel_timing_support",
    ],
    "device_runtime.engine": [
        "AUTO", "Backend", "DeviceRunner", "EXACT", "FAST", "FAST_AGREEMENT", "INT8_MARGIN", "LiteRTBackend",
        "OnnxBackend", "PRECISIONS", "PREPROCESS_PATHS", "check_input", "default_split", "fast_preprocess",
        "load_backend", "prefers_int8", "preprocess", "preprocess_path", "session_options", "usable_cpus",
    ],
    "device_runtime.live": [
        "LIVE_WALLS", "HttpConnection", "HttpRequest", "LiveBoard", "LiveServer", "LiveSource", "WalledServer", "Walls", "live_flag",
        "live_token", "page", "parse_live_address",
    ],
    "device_runtime.hosts": [
        "HostAdvert", "HostLink", "LinkMeter", "connect_host", "discover", "host_address", "probe_bytes",
    ],
    "device_runtime.stream": [
        "AutoPolicy", "BanditPolicy", "BoardPace", "CameraLoad", "Choice", "DROP_QUEUE_FULL", "DropForecast", "Frame",
        "FrameQueue", "FrameResult", "FrameSource", "HeadTimes", "IMAGE_SUFFIXES", "Pipeline", "PipelineConfig",
        "PipelineStats", "Reason", "RunEvents", "SplitPolicy", "StaticPolicy", "open_source", "pi_camera_absent",
        "read_pace", "top1",
    ],
    "device_runtime.stream.trace": [
        "HEAD_TIMES", "LINK_RATE", "TRACE_SCHEMA", "TraceWriter", "append_link_rate", "frame_record", "read_head_times",
        "read_records",
    ],
    "device_runtime.board": [
        "CAMERA_GROUP", "DEFAULT_BATCHES", "DEFAULT_FRAME", "DetectedBoard", "InstalledBackend", "LastRun", "Layout",
        "Rounds", "SERVICE", "START_TIMEOUT_S", "Scene", "UpdateDeferred", "add_commands", "add_service_command",
        "calibrate", "calibration_for", "calibrations_for", "default_root", "detect_board", "device_unit", "handler",
        "install_service", "installed_backends", "precision_of", "resolve_backend", "run_checker", "settings_for",
        "spread_warning", "write_settings",
    ],
    "device_runtime.board.run_settings": [
        "ACCURACY_LOSS", "AGREEMENT", "AUTO", "BATCH", "CalibrateSettings", "Connection", "FPS", "FRAMES", "FRAME_SIDE", "KEEP", "KEYS", "Key",
        "QUEUE", "REPEATS", "RunSettings", "Runtime", "START_TIMEOUT", "SUMMARY_EVERY", "SettingError", "THREADS",
        "as_flag_type", "batches", "calibrate_settings", "run_settings",
    ],
    "host_runtime": [
        "BatchConfig", "HostServer", "ServerConfig", "TailRegistry",
    ],
    "fieldtrial": [
        "Trace", "format_summary", "load_trace", "plot_drop_rate", "plot_latency_cdf", "plot_latency_over_time",
        "plot_measured_vs_model", "plot_table", "read_trace", "summarize", "write_report",
    ],
    "testbed": [
        "DelayRelay", "EmulatedLink", "LinkEmulationError", "LinkEmulationUnavailable", "RateSchedule",
        "RateStep", "free_port", "own_peer", "remove_stale_links", "serve_in", "tbf_parameters", "trace_steps", "unavailable_reason",
    ],
    "exporter.deploy": [
        "BoardFacts", "BoardResult", "Fleet", "FleetResult", "Release", "Remote", "UploadStats",
        "add_deploy_command", "board_steps", "deploy_board", "parse_max_fail", "probe", "rollback_board",
    ],
    "exporter": [
        "BuildSpec", "Case", "Chain", "CutPoint", "ExitOptions", "LoadedModel", "OnnxRunner", "Runner", "TracedModel", "build_bundle",
        "compare", "export_onnx", "find_cut_points", "get_cut_point", "load_model", "select_splits", "split_at",
        "trace", "validate",
    ],
}


@pytest.mark.parametrize("package", sorted(FACES))
def test_public_face(package: str) -> None:
    if package == "exporter":
        pytest.importorskip("torch", reason="the exporter's face needs the workstation environment")
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(FACES[package])
    assert [name for name in module.__all__ if not hasattr(module, name)] == []


ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("splitedge", "boards", "calibration", "device_runtime", "host_runtime", "exporter", "fieldtrial", "testbed")
#: Every package with a face: the directories holding an ``__init__.py``.
PACKAGES = {".".join(init.parent.relative_to(ROOT).parts) for top in PRODUCT for init in (ROOT / top).rglob("__init__.py")}


def _package_of(dotted: str) -> str | None:
    """The innermost package holding ``dotted`` (a module, or a name imported from a face)."""
    parts = dotted.split(".")
    return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in PACKAGES), None)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``from X import ...`` in ``path``, at any depth."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.lineno, node.module) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and not node.level and node.module]


def test_code_outside_a_package_imports_only_its_face() -> None:
    offences = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            here = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            for line, module in _imports(path):
                package = _package_of(module)
                if package is None or module == package or module in FACES:
                    continue  # a face, or a public sub-face (``device_runtime.wire.ops``)
                if here == package or here.startswith(package + "."):
                    continue  # inside the package: its own modules are its own business
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {module}, past the face of {package}")
    assert offences == []


def test_the_face_check_sees_a_deep_import(tmp_path: Path) -> None:
    """The walker itself: it must find the module of a ``from`` import wherever it stands."""
    probe = tmp_path / "probe.py"
    probe.write_text("def go():\n    from device_runtime.wire._framing import FrameDecoder\n")
    assert _imports(probe) == [(2, "device_runtime.wire._framing")]
    assert _package_of("device_runtime.wire._framing") == "device_runtime.wire"
    assert "device_runtime.wire._framing" not in FACES and "device_runtime.wire.ops" in FACES  # refused; a sub-face
    assert _package_of("device_runtime.Bundle") == "device_runtime"


#: No face (nor sub-face) exports more than this: python-zeroconf, the anchor, exports 23.
MAX_NAMES = 30
#: Modules started by name (``python -m``, entry points) that keep their names.
LAUNCHED: dict[str, tuple[str, ...]] = {
    "device_runtime": ("cli",), "host_runtime": ("cli",), "exporter": ("cli", "zoo"), "fieldtrial": ("commands",),
    "testbed": ("board_box", "board_probe"),
}
#: Packages whose modules are their face, a sub-face in FACES, or private (a leading underscore).
PRIVATE = tuple(sorted(PACKAGES))


def _inside(here: str, face: str) -> bool:
    package = _package_of(face)
    return here == package or here.startswith(f"{package}.")


@pytest.mark.parametrize("face", sorted(FACES))
def test_no_face_exports_more_than_thirty_names(face: str) -> None:
    assert len(FACES[face]) <= MAX_NAMES, f"{face} exports {len(FACES[face])} names"


def test_every_name_imported_from_a_face_is_on_it() -> None:
    """``from device_runtime.wire import X`` outside the package, or ``import calibration as cal``
    and ``cal.X``: X is in the face's ``__all__`` (a name left off a face is not the package's to
    give, even where the module has it)."""
    offences = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            here = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(), filename=str(path))
            aliases: dict[str, str] = {}  # local name -> the face ``import face as name`` bound it to
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    aliases.update({alias.asname: alias.name for alias in node.names
                                    if alias.asname and alias.name in FACES})
                if not (isinstance(node, ast.ImportFrom) and not node.level and node.module in FACES):
                    continue
                package = _package_of(node.module)
                if here == package or here.startswith(f"{package}."):
                    continue
                offences += [f"{path.relative_to(ROOT)}:{node.lineno} {alias.name} from {node.module}"
                             for alias in node.names if alias.name not in FACES[node.module]]
            offences += [f"{path.relative_to(ROOT)}:{node.lineno} {node.attr} of {aliases[node.value.id]}"
                         for node in ast.walk(tree)
                         if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                         and node.value.id in aliases and not _inside(here, aliases[node.value.id])
                         and node.attr not in FACES[aliases[node.value.id]]]
    assert offences == []


@pytest.mark.parametrize("package", PRIVATE)
def test_modules_that_are_no_face_are_private(package: str) -> None:
    folder = ROOT.joinpath(*package.split("."))
    public = [path.name for path in sorted(folder.glob("*.py"))
              if path.name != "__init__.py" and not path.name.startswith("_")
              and f"{package}.{path.stem}" not in FACES and path.stem not in LAUNCHED.get(package, ())]
    assert public == []
