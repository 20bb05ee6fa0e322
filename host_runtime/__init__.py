"""The host: serves tails (and the full model, for full offload) of one or more bundles to
many boards over TCP, batched, metered, authenticated, advertised with zeroconf. No torch."""

from host_runtime._batcher import BatchConfig
from host_runtime._server import HostServer, ServerConfig
from host_runtime._tails import TailRegistry

__all__ = ["BatchConfig", "HostServer", "ServerConfig", "TailRegistry"]
