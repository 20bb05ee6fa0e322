"""How a command ends: one line and a known exit status, whatever ends it.

A service turns signals into a flag: SIGINT and SIGTERM set an event its main loop awaits (as
uvicorn does, :func:`stop_on_signals`), so shutdown is ordinary code — withdraw the zeroconf
record, close sockets, finish or fail what is in flight — bounded in time. Every other command
(an export, a calibration, a verify) is simply stopped: :func:`exit_on_signals` raises
:class:`Stopped` where it runs, the code it unwinds through removes what it had half written
(a build's staging, a slice's), and the command ends with one line on stderr and exit status
130 or 143, as a shell reports a process killed by SIGINT or SIGTERM, instead of a traceback of
a hundred lines. A :class:`SplitEdgeError` ends it with one line and 2. And a service tells
systemd how it is (:func:`notify`): ready once it has answered a frame, stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import traceback
from typing import Callable, Coroutine, Iterator

from splitedge.errors import SplitEdgeError

#: The exit status of a command a signal stopped: 128 + the signal's number, as a shell reports it.
__all__ = ["SIGNAL_EXIT", "Runner", "Stopped", "exit_on_signals", "notify", "run_command", "signals_held", "stop_on_signals"]

SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
_SAID = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread as Python raises KeyboardInterrupt for Ctrl-C.

    A KeyboardInterrupt, so that every ``except BaseException`` or ``finally`` that cleans up after
    Ctrl-C (a build's staging directory, a slice's) cleans up after SIGTERM too, and asyncio lets
    it out of its event loop as it does Ctrl-C, after cancelling the tasks left.
    """

    def __init__(self, signum: signal.Signals) -> None:
        super().__init__(signum.name)
        self.signum = signum


#: How long a command has to unwind after a signal before the signal is delivered again.
REDELIVER_S = 5.0


class _Stopper:
    """The SIGINT and SIGTERM handler of one command: raises :class:`Stopped`, and notes the signal.

    C extensions can swallow the exception: pybind11 turns one raised while it initialises a module
    into an ImportError (onnxruntime then reads as not installed), and a library that tries an
    optional import goes on without it. So the signal is noted, any error after it ends the command
    as the signal would, and a command still running ``REDELIVER_S`` after it gets it again.
    """

    def __init__(self) -> None:
        self.caught: list[signal.Signals] = []
        self.done = False

    def __call__(self, signum: int, _frame: object) -> None:
        sig = signal.Signals(signum)
        self.caught.append(sig)
        again = threading.Timer(REDELIVER_S, self._again, (sig, len(self.caught)))
        again.daemon = True
        again.start()
        raise Stopped(sig)

    def _again(self, sig: signal.Signals, seen: int) -> None:
        if not self.done and len(self.caught) == seen:
            os.kill(os.getpid(), sig)


def exit_on_signals(prog: str, command: Callable[[], int], debug: bool = False) -> int:
    """Run ``command`` (a CLI's work, returning its exit status) and end it in one line whatever happens.

    SIGINT or SIGTERM raise :class:`Stopped` where the main thread is; once it has unwound (its
    cleanups run), one line on stderr and exit status 130 or 143 (:data:`SIGNAL_EXIT`). A second
    signal after that is left to the default action: the process ends at once, silently. A
    :class:`SplitEdgeError` is ``PROG: error: MESSAGE`` and exit status 2. A signal the process
    was started ignoring (a shell's background job and SIGINT) stays ignored. With ``debug``, the
    error's whole chain (what a library raised under it) is printed before its line.
    """
    stopper = _Stopper()
    previous = {sig: signal.signal(sig, stopper) for sig in SIGNAL_EXIT if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        status = command()
    except SplitEdgeError as exc:
        if not stopper.caught:
            status = 2
            if debug:
                traceback.print_exception(exc)
            print(f"{prog}: error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:  # Stopped, or Ctrl-C where an event loop had put Python's own handler back
        stopper.caught.append(signal.SIGINT)
    except BaseException:
        if not stopper.caught:  # what a library made of the Stopped it caught: the signal ends the command
            raise
    finally:
        stopper.done = True
    if stopper.caught:
        for sig in SIGNAL_EXIT:
            signal.signal(sig, signal.SIG_DFL)
        print(f"{prog}: stopped by {_SAID[stopper.caught[0]]} before it finished; nothing it was writing was kept: "
              "run it again", file=sys.stderr, flush=True)
        return SIGNAL_EXIT[stopper.caught[0]]
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    return status


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGINT or SIGTERM; a second signal falls back to the default (hard) action."""
    loop = asyncio.get_running_loop()

    def handle(sig: signal.Signals) -> None:
        stop.set()
        loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle, sig)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM over steps that must not be cut in two (a bundle replaced by its new
    build: the old one renamed away, the new one renamed in, the old one removed; a staging
    directory removed): one that arrives meanwhile is delivered once they are done."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum)) for sig in SIGNAL_EXIT}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            signal.raise_signal(caught[0])


Runner = Callable[[Coroutine[object, object, object]], object]


def run_command(prog: str, main: Coroutine[object, object, object], runner: Runner = asyncio.run) -> int:
    """Run a CLI's coroutine with ``runner`` (``asyncio.run``; the host may pass uvloop's), ended as
    :func:`exit_on_signals` ends a command: a :class:`SplitEdgeError` (a bad calibration included) is
    one line on stderr and exit status 2, a signal one line and 130 or 143. A service that stops
    gracefully on a signal (:func:`stop_on_signals`) returns normally, and exits 0."""

    def run() -> int:
        try:
            runner(main)
        finally:
            main.close()  # a no-op once it ran; never awaited when no loop could be had, and must not warn so
        return 0

    return exit_on_signals(prog, run)


def notify(state: str) -> bool:
    """``sd_notify(3)``: one datagram of ``NAME=VALUE`` lines to ``$NOTIFY_SOCKET``, as systemd's
    ``Type=notify`` units do (``READY=1``, ``STATUS=…``, ``STOPPING=1``). A ``Type=notify`` unit is
    "active" only once ``READY=1`` arrives, so ``systemctl restart`` returns when the service
    really works, and fails when it never does. Outside such a unit (no ``NOTIFY_SOCKET``) it
    does nothing and returns False; a socket that cannot be reached is a warning, never an error."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path  # '@': the abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        print(f"warning: could not tell systemd {state.splitlines()[0]!r} at {path}: {exc}", file=sys.stderr)
        return False
    return True
