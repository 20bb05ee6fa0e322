"""The stream: frame sources, the frame queue, the split policy and why it chose (its reasons), the
pipeline that overlaps capture, head, transfer and tail, each frame's result, the run's events (split
changes and summaries), the trace writer, and a recorded board's pace for a replay to run at."""

from device_runtime.stream.camera import Frame, FrameSource, open_source
from device_runtime.stream.camera_load import CameraLoad
from device_runtime.stream.frame_queue import FrameQueue
from device_runtime.stream.pace import BoardPace, read_pace
from device_runtime.stream.pipeline import Pipeline, PipelineConfig, PipelineStats
from device_runtime.stream.policy import AutoPolicy, BanditPolicy, HeadTimes, SplitPolicy, StaticPolicy
from device_runtime.stream.reason import Choice, Reason
from device_runtime.stream.results import DROP_QUEUE_FULL, FrameResult, top1
from device_runtime.stream.summary import DropForecast, RunEvents
from device_runtime.stream.trace import (
    HEAD_TIMES, LINK_RATE, TRACE_SCHEMA, TraceWriter, append_link_rate, frame_record, read_head_times,
)

from device_runtime.stream.camera import IMAGE_SUFFIXES
from device_runtime.stream.picamera import pi_camera_absent

__all__ = [
    "AutoPolicy",
    "DROP_QUEUE_FULL",
    "BanditPolicy",
    "BoardPace",
    "CameraLoad",
    "Choice",
    "DropForecast",
    "Frame",
    "FrameQueue",
    "FrameResult",
    "FrameSource",
    "HEAD_TIMES",
    "HeadTimes",
    "IMAGE_SUFFIXES",
    "LINK_RATE",
    "Pipeline",
    "PipelineConfig",
    "PipelineStats",
    "Reason",
    "RunEvents",
    "SplitPolicy",
    "StaticPolicy",
    "TRACE_SCHEMA",
    "TraceWriter",
    "append_link_rate",
    "frame_record",
    "open_source",
    "pi_camera_absent",
    "read_head_times",
    "read_pace",
    "top1",
]
