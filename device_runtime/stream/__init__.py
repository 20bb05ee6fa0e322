"""The stream: frame sources, the frame queue, the split policy and why it chose (its reasons), the
pipeline that overlaps capture, head, transfer and tail, each frame's result, the run's events (split
changes and summaries), and a recorded board's pace for a replay to run at. The trace (its writer,
its schema and record kinds) is a public sub-face of its own, :mod:`device_runtime.stream.trace`;
the rest is private."""

from device_runtime.stream._camera import IMAGE_SUFFIXES, Frame, FrameSource, open_source
from device_runtime.stream._camera_load import CameraLoad
from device_runtime.stream._frame_queue import FrameQueue
from device_runtime.stream._pace import BoardPace, read_pace
from device_runtime.stream._picamera import pi_camera_absent
from device_runtime.stream._pipeline import Pipeline, PipelineConfig, PipelineStats
from device_runtime.stream._policy import AutoPolicy, BanditPolicy, HeadTimes, SplitPolicy, StaticPolicy
from device_runtime.stream._reason import Choice, Reason
from device_runtime.stream._results import DROP_QUEUE_FULL, FrameResult, top1
from device_runtime.stream._summary import DropForecast, RunEvents

__all__ = [
    "AutoPolicy", "BanditPolicy", "BoardPace", "CameraLoad", "Choice", "DROP_QUEUE_FULL", "DropForecast", "Frame",
    "FrameQueue", "FrameResult", "FrameSource", "HeadTimes", "IMAGE_SUFFIXES", "Pipeline", "PipelineConfig",
    "PipelineStats", "Reason", "RunEvents", "SplitPolicy", "StaticPolicy", "open_source", "pi_camera_absent",
    "read_pace", "top1",
]
