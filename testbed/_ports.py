"""A free TCP port, for a server that must be told its port before it starts.

Where a server can bind port 0 and say which port it got, that is better (no race); an sshd in the
board in a box or a host in a namespace is told its port on its command line, so it is picked here:
bound to port 0 on 127.0.0.1 and released, which another process could take in between (rare: the
kernel hands ephemeral ports out in turn).
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
