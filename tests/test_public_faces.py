"""Each package's ``__init__.py`` is its public face: ``__all__`` pinned here, every name real.

A name added to or dropped from a face is a change to what users import; it should be made
here on purpose, not by accident. ``calibration`` and ``boards`` pin theirs in their own tests.
"""

from __future__ import annotations

import importlib

import pytest

FACES = {
    "splitedge": ["LOCAL", "OFFLOAD", "SplitEdgeError"],
    "device_runtime": ["Bundle", "LOCAL", "Manifest", "OFFLOAD"],
    "device_runtime.wire": [
        "DEFAULT_MAX_FRAME_BYTES", "DeviceAuth", "ERROR_CODES", "ErrorReply", "FrameAuth", "FrameDecoder",
        "FramedProtocol", "HelloReply", "HelloRequest", "Hop", "HopTiming", "HostAuth", "InferReply", "InferRequest",
        "MAX_ROUTE_HOPS", "OPS", "Oversized",
        "PROTOCOL_VERSION", "PingReply", "PingRequest", "ProfileReply", "ProfileRequest", "Quantization", "REPLIES",
        "REQUESTS", "Reply", "Request", "StatsReply", "StatsRequest", "TxtRecord", "affine_params", "client_context",
        "decode", "decode_tensor", "dequantize", "encode", "encode_bytes", "encode_message", "error_reply",
        "load_key", "parse_reply", "parse_request", "parse_txt", "quantize", "server_context", "txt_record",
    ],
    "device_runtime.engine": [
        "Backend", "DeviceRunner", "INT8_MARGIN", "LiteRTBackend", "OnnxBackend", "PRECISIONS", "default_split",
        "load_backend", "prefers_int8", "preprocess",
    ],
    "device_runtime.hosts": [
        "ClientPool", "Credentials", "HostAdvert", "HostClient", "HostLink", "InferResult", "LinkMeter", "connect_host", "discover",
    ],
    "device_runtime.stream": [
        "AutoPolicy", "BanditPolicy", "Frame", "FrameQueue", "FrameResult", "FrameSource", "Pipeline", "PipelineConfig",
        "PipelineStats", "SplitPolicy", "StaticPolicy", "TRACE_SCHEMA", "TraceWriter", "open_source", "top1",
    ],
    "device_runtime.board": [
        "DEFAULT_BATCHES", "DetectedBoard", "InstalledBackend", "Layout", "UpdateDeferred", "calibrate",
        "calibration_for", "default_root", "detect_board", "installed_backends", "resolve_backend",
    ],
    "host_runtime": ["BatchConfig", "HostServer", "ServerConfig", "TailRegistry"],
    "fieldtrial": [
        "format_summary", "plot_drop_rate", "plot_latency_cdf", "plot_latency_over_time", "plot_measured_vs_model",
        "plot_table", "read_trace", "summarize", "write_report",
    ],
    "testbed": [
        "DelayRelay", "EmulatedLink", "LinkEmulationError", "LinkEmulationUnavailable", "RateSchedule", "RateStep",
        "remove_stale_links", "serve_in", "tbf_parameters", "unavailable_reason",
    ],
    "exporter.deploy": [
        "BoardFacts", "BoardResult", "Fleet", "FleetResult", "Release", "Remote", "UploadStats", "board_steps",
        "deploy_board", "parse_max_fail", "probe", "rollback_board",
    ],
    "exporter": [
        "Case", "Chain", "CutPoint", "LoadedModel", "OnnxRunner", "Runner", "TracedModel", "build_bundle", "compare",
        "export_onnx", "find_cut_points", "get_cut_point", "load_model", "select_splits", "split_at", "trace", "validate",
    ],
}


@pytest.mark.parametrize("package", sorted(FACES))
def test_public_face(package: str) -> None:
    if package == "exporter":
        pytest.importorskip("torch", reason="the exporter's face needs the workstation environment")
    module = importlib.import_module(package)
    assert sorted(module.__all__) == sorted(FACES[package])
    assert [name for name in module.__all__ if not hasattr(module, name)] == []
