"""Live pages: a run watched from a browser while it runs (``split-device run --live``,
``split-host serve --live``).

:class:`LiveServer` serves one page and its state from one thread of its own (standard library
only); :class:`LiveBoard` is what the board's stream publishes to (O(1) per frame); :func:`page`
is the shared shell the host's page is built in. :class:`WalledServer` (with :class:`HttpRequest`
and :class:`HttpConnection`) is the bounded HTTP both the live pages and the host's metrics
endpoint are served with: one selector, capped connections, whole-request deadlines, a duty cap.
Nothing here reaches the network beyond the address it is given, and nothing on a page is loaded
from elsewhere.
"""

from device_runtime.live._board_state import LiveBoard
from device_runtime.live._http import HttpConnection, HttpRequest, WalledServer, Walls
from device_runtime.live._page import page
from device_runtime.live._server import LIVE_WALLS, LiveServer, LiveSource, live_flag, live_token, parse_live_address

__all__ = [
    "LIVE_WALLS", "HttpConnection", "HttpRequest", "LiveBoard", "LiveServer", "LiveSource", "WalledServer", "Walls", "live_flag",
    "live_token", "page", "parse_live_address",
]
