"""What ``split-host serve`` runs with: one typed, checked value, as the board's ``RunSettings`` is.

The flags are parsed by argparse (each number through :mod:`host_runtime._flags`' bounds, so a
value out of range never gets here); :meth:`HostSettings.from_args` takes the parsed flags,
checks what one flag says about another (``--tls-cert`` without ``--tls-key``, a partial-frame
budget smaller than one frame, ``--live`` with several processes, a metrics address that would
need a token), and is the only place that reads the argparse namespace. ``serve``, the
``--procs`` children (which get it pickled) and ``install-service`` all take the same
:class:`HostSettings`; :meth:`HostSettings.server_config` is the one translation into the
server's :class:`~host_runtime._server.ServerConfig`, and :meth:`HostSettings.flags` the one back
into ``serve``'s flags (the unit ``install-service`` writes runs serve with them).
"""

from __future__ import annotations

import argparse
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

from host_runtime._batcher import BatchConfig
from host_runtime._metrics_http import check_metrics_flags, read_token_file
from host_runtime._procs import AUTO
from host_runtime._server import ServerConfig
from host_runtime._tails import bucket_sizes
from splitedge import SettingError, SplitEdgeError

__all__ = ["SHARE_QUEUE", "HostSettings", "LIVE_ONE_PROCESS"]

#: --share-queue: a worker's share of the queue, or all it may take; auto: the host decides by its
#: tails' device (BatchConfig.share None).
SHARE_QUEUE: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
LIVE_ONE_PROCESS = "--live shows one process's connections and queue: use it with --procs 1"
MiB = 2**20


@dataclass(frozen=True)
class HostSettings:
    """``split-host serve``'s flags as the host uses them (names as the flags', ``--no-zeroconf`` as
    ``zeroconf``, ``--peer`` as ``peers``); each number already within its bounds."""

    bundles: tuple[str, ...]
    interface: str
    port: int
    zeroconf: bool
    workers: int | None
    threads: int | None
    max_frame_mb: float
    max_partial_mb: float | None
    max_connections: int
    max_connections_per_address: int
    idle_timeout: float
    frame_timeout: float
    first_frame_timeout: float
    drain_timeout: float
    profile_budget_ms: float
    device: str
    tf32: bool
    buckets: str | tuple[int, ...]
    max_batch: int
    max_wait_ms: float
    share_queue: str
    max_queue: int
    metrics_port: int | None
    metrics_interface: str
    metrics_token_file: str | None
    live: str | None
    key_file: str | None
    tls_cert: str | None
    tls_key: str | None
    loop: str
    peers: tuple[str, ...]
    procs: int | str  # a number, or AUTO until main decides it from the cores
    verbose: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> HostSettings:
        """The settings of parsed ``serve`` (or ``install-service``) flags; :class:`SettingError`
        with the one line to print when one flag contradicts another."""
        settings = cls(
            bundles=tuple(args.bundles), interface=args.interface, port=args.port, zeroconf=not args.no_zeroconf,
            workers=args.workers, threads=args.threads, max_frame_mb=args.max_frame_mb,
            max_partial_mb=args.max_partial_mb, max_connections=args.max_connections,
            max_connections_per_address=args.max_connections_per_address, idle_timeout=args.idle_timeout,
            frame_timeout=args.frame_timeout, first_frame_timeout=args.first_frame_timeout,
            drain_timeout=args.drain_timeout, profile_budget_ms=args.profile_budget_ms, device=args.device,
            tf32=args.tf32, buckets=args.buckets, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
            share_queue=args.share_queue, max_queue=args.max_queue, metrics_port=args.metrics_port,
            metrics_interface=args.metrics_interface, metrics_token_file=args.metrics_token_file, live=args.live,
            key_file=args.key_file, tls_cert=args.tls_cert, tls_key=args.tls_key, loop=args.loop,
            peers=tuple(args.peer), procs=args.procs, verbose=args.verbose,
        )
        settings.check()
        return settings

    def check(self) -> None:
        """What one flag says about another, refused in one line before anything loads or starts."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingError("--tls-cert and --tls-key go together")
        try:
            if self.metrics_port is not None:
                check_metrics_flags(self.metrics_interface, self.key_file, self.metrics_token_file)
            bucket_sizes(self.buckets, self.max_batch, cuda=True)
        except SplitEdgeError as exc:
            raise SettingError(str(exc)) from None
        if self.live is not None and self.procs not in (1, AUTO):
            raise SettingError(LIVE_ONE_PROCESS)
        if self.max_partial_mb is not None and self.max_partial_mb < self.max_frame_mb:
            raise SettingError(f"--max-partial-mb {self.max_partial_mb:g} cannot hold one frame of "
                               f"--max-frame-mb {self.max_frame_mb:g}")

    def flags(self, defaults: HostSettings) -> Iterator[tuple[str, str, str | None]]:
        """``(setting, flag, value)`` for each setting that differs from ``defaults`` (a bare
        ``serve``'s), in the fields' order: what serve must be given to run with these settings
        (``value`` None for a switch; the bundles are the caller's). Every setting is a flag of
        the same name but two, ``zeroconf`` (``--no-zeroconf``) and ``peers`` (``--peer``, repeated)."""
        for field in fields(self):
            name = field.name
            value = getattr(self, name)
            if name == "bundles" or value == getattr(defaults, name):
                continue
            if name == "zeroconf":
                yield name, "--no-zeroconf", None
            elif name == "peers":
                yield from ((name, "--peer", peer) for peer in value)
            elif isinstance(value, bool):
                yield name, "--" + name.replace("_", "-"), None
            else:
                yield name, "--" + name.replace("_", "-"), str(value)

    def with_procs(self, procs: int) -> HostSettings:
        """These settings with ``--procs auto`` decided."""
        return replace(self, procs=procs)

    def server_config(self, *, workers: int, max_connections: int, buckets: tuple[int, ...], key: bytes | None,
                      tls: ssl.SSLContext | None, child_port: int | None) -> ServerConfig:
        """The server's configuration: ``workers``, ``max_connections`` (as the descriptor limit
        allows) and ``buckets`` as decided for this process; ``child_port``: the shared port of a
        ``--procs`` child, whose metrics go to the parent on a free loopback port."""
        child = child_port is not None
        max_frame_bytes = int(self.max_frame_mb * MiB)
        return ServerConfig(
            host=self.interface, port=self.port if child_port is None else child_port, workers=workers,
            max_frame_bytes=max_frame_bytes,
            batching=BatchConfig(max_batch=self.max_batch, max_wait_ms=self.max_wait_ms, max_queue=self.max_queue,
                                 buckets=buckets, share=SHARE_QUEUE[self.share_queue]),
            metrics_port=self.metrics_port if not child or self.metrics_port is None else 0,
            metrics_host=self.metrics_interface if not child else "127.0.0.1",
            metrics_token=read_token_file(self.metrics_token_file) if self.metrics_token_file and not child else None,
            key=key, tls=tls, max_connections=max_connections,
            max_connections_per_address=self.max_connections_per_address, idle_timeout=self.idle_timeout,
            frame_timeout=self.frame_timeout, first_frame_timeout=self.first_frame_timeout,
            shutdown_timeout=self.drain_timeout, profile_budget_s=self.profile_budget_ms / 1000,
            max_partial_bytes=4 * max_frame_bytes if self.max_partial_mb is None else int(self.max_partial_mb * MiB),
            peers=self.peers, reuse_port=child,
        )
