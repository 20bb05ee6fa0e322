"""A real host on 127.0.0.1 with --key-file and/or TLS: the right key served, everything else refused and counted.

Socket-level tests speak the protocol by hand (with the sans-IO :class:`DeviceAuth`) so they
can change, record and replay the exact bytes of a frame.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import Bundle
from device_runtime.link import Credentials, HostClient
from device_runtime.hosts._connect import connect_host
from device_runtime.hosts._discovery import discover
from device_runtime.wire._auth import DeviceAuth
from device_runtime.wire._protocol import decode, encode
from device_runtime.wire._tls import client_context, server_context
from host_runtime._advertise import Advertiser
from splitedge.errors import AuthenticationError, HostUnavailableError
from tests.conftest import TEST_SPLITS, RunningHost, start_host
from tests.host_runtime.test_server import ATOL, cut_tensor

KEY = b"5f0c8e0a6d4b4f1b9d2e7a3c1b0f9e8d"
OTHER_KEY = b"00000000000000000000000000000000"
SPLIT = TEST_SPLITS[1]


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


@pytest.fixture(scope="module")
def keyed_host(mobilenet_bundle):
    yield from start_host([mobilenet_bundle], key=KEY)


# --- helpers --------------------------------------------------------------------------------------


def read_body(sock: socket.socket) -> bytes | None:
    """One frame's body, or None when the host has closed the connection."""

    def exactly(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    header = exactly(4)
    return None if header is None else exactly(struct.unpack(">I", header)[0])


def sealed(auth: DeviceAuth, message: dict, tensor: np.ndarray | None = None) -> bytes:
    return b"".join(bytes(b) for b in auth.seal(encode(message, tensor)))


def receive(sock: socket.socket, auth: DeviceAuth) -> dict:
    body = read_body(sock)
    assert body is not None, "host closed the connection"
    content = auth.open(memoryview(body))
    assert content is not None
    return decode(content)


def open_session(host: RunningHost, key: bytes = KEY) -> tuple[socket.socket, DeviceAuth, bytes]:
    """A raw, authenticated connection: challenge read, auth frame sent (and returned, for replays)."""
    sock = socket.create_connection((host.host, host.port), timeout=10)
    auth = DeviceAuth(key)
    challenge = read_body(sock)
    assert auth.open(memoryview(challenge)) is None
    auth_frame = sealed(auth, auth.auth_message())
    sock.sendall(auth_frame)
    return sock, auth, auth_frame


def assert_refused_and_closed(sock: socket.socket, auth: DeviceAuth | None = None) -> None:
    """One ``unauthorized`` reply with no id (nothing of the frame is trusted), then the host hangs up."""
    body = read_body(sock)
    assert body is not None, "the host closed without saying why"
    if auth is not None and auth.established and body[0] == 0xC1:
        reply = decode(auth.open(memoryview(body)))
    else:
        reply = decode(body)
    assert reply["ok"] is False and reply["id"] is None
    assert reply["error"]["code"] == "unauthorized"
    assert read_body(sock) is None  # closed: one refusal, no second try on this connection


def refusals(host: RunningHost) -> dict[str, int]:
    async def read():
        stats = host.server.stats.as_dict()
        return {"unauthorized": stats["errors"]["unauthorized"], **stats["frames_refused"]}

    return host.call(read)


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


async def with_client(host: RunningHost, fn, credentials: Credentials = Credentials(), timeout: float = 5.0,
                      address: str | None = None):
    client = await HostClient.connect(address or host.host, host.port, timeout=timeout, credentials=credentials)
    try:
        return await fn(client)
    finally:
        await client.close()


# --- the right key ----------------------------------------------------------------------------------


def test_right_key_is_served_and_answers_equal_the_keyless_path(keyed_host, host, bundle) -> None:
    cuts = [cut_tensor(bundle, TEST_SPLITS[i % 2], 1 + i % 3, seed=i)[0] for i in range(6)]

    async def session(client: HostClient):
        # Several requests in flight on one connection: counters follow the order frames hit the wire.
        results = await asyncio.gather(*(client.infer(bundle.id, TEST_SPLITS[i % 2], c) for i, c in enumerate(cuts)))
        ping = await client.request({"op": "ping"}, 5.0, np.zeros(100_000, np.uint8))
        return client.server_info, [r.output for r in results], ping["bytes"]

    info, keyed, pinged = asyncio.run(with_client(keyed_host, session, Credentials(key=KEY)))
    plain_info, plain, _ = asyncio.run(with_client(host, session))
    assert info["auth"] is True and plain_info["auth"] is False
    assert info["bundles"] == plain_info["bundles"]
    for a, b in zip(keyed, plain):
        np.testing.assert_array_equal(a, b)
    assert pinged == 100_000


def test_raw_session_gets_the_full_models_answer(keyed_host, bundle) -> None:
    cut, expected = cut_tensor(bundle, SPLIT, 2)
    sock, auth, _ = open_session(keyed_host)
    with sock:
        sock.sendall(sealed(auth, {"op": "infer", "id": 7, "bundle": bundle.id, "split": SPLIT}, cut))
        reply = receive(sock, auth)
    assert reply["id"] == 7
    np.testing.assert_allclose(reply["tensor"], expected, atol=ATOL, rtol=0)


# --- refusals ---------------------------------------------------------------------------------------


def test_wrong_key_is_refused(keyed_host) -> None:
    before = refusals(keyed_host)
    with pytest.raises(AuthenticationError, match="refused this device: authentication failed"):
        asyncio.run(with_client(keyed_host, lambda c: c.stats(), Credentials(key=OTHER_KEY)))
    assert delta(before, refusals(keyed_host)) == {"unauthorized": 1, "bad_mac": 1}


def test_missing_key_is_refused(keyed_host) -> None:
    with pytest.raises(AuthenticationError, match="requires authenticated frames: give this device the host's key"):
        asyncio.run(with_client(keyed_host, lambda c: c.stats()))
    # By hand: the host speaks first (its challenge), and a plain request is refused.
    before = refusals(keyed_host)
    with socket.create_connection((keyed_host.host, keyed_host.port), timeout=10) as sock:
        challenge = decode(read_body(sock))
        assert challenge["op"] == "challenge" and challenge["auth"] == "hmac-sha256" and len(challenge["nonce"]) == 16
        sock.sendall(b"".join(encode({"op": "ping", "id": 1})))
        reply = decode(read_body(sock))
        assert "requires authenticated frames" in reply["error"]["message"]
        assert reply["error"]["code"] == "unauthorized" and reply["id"] is None
        assert read_body(sock) is None
    assert delta(before, refusals(keyed_host)) == {"unauthorized": 1, "unauthenticated": 1}


def test_tampered_frame_is_refused(keyed_host, bundle) -> None:
    """One tensor byte flipped after the MAC was computed, on the socket."""
    cut, _ = cut_tensor(bundle, SPLIT, 1)
    before = refusals(keyed_host)
    sock, auth, _ = open_session(keyed_host)
    with sock:
        frame = bytearray(sealed(auth, {"op": "infer", "id": 1, "bundle": bundle.id, "split": SPLIT}, cut))
        frame[-1000] ^= 0x04  # inside the tensor's bytes
        sock.sendall(frame)
        assert_refused_and_closed(sock, auth)
    assert delta(before, refusals(keyed_host)) == {"unauthorized": 1, "bad_mac": 1}


def test_replayed_frame_is_refused_on_the_same_connection(keyed_host, bundle) -> None:
    cut, _ = cut_tensor(bundle, SPLIT, 1)
    before = refusals(keyed_host)
    sock, auth, _ = open_session(keyed_host)
    with sock:
        frame = sealed(auth, {"op": "infer", "id": 1, "bundle": bundle.id, "split": SPLIT}, cut)
        sock.sendall(frame)
        assert receive(sock, auth)["ok"] is True
        sock.sendall(frame)  # the same bytes again
        assert_refused_and_closed(sock, auth)
    assert delta(before, refusals(keyed_host)) == {"unauthorized": 1, "replayed": 1}


def test_replayed_frames_are_refused_on_a_new_connection(keyed_host, bundle) -> None:
    cut, _ = cut_tensor(bundle, SPLIT, 1)
    sock, auth, recorded_auth = open_session(keyed_host)
    with sock:
        recorded_request = sealed(auth, {"op": "infer", "id": 1, "bundle": bundle.id, "split": SPLIT}, cut)
        sock.sendall(recorded_request)
        assert receive(sock, auth)["ok"] is True
    before = refusals(keyed_host)
    # The recorded handshake, on a new connection: bound to the old challenge's nonce.
    with socket.create_connection((keyed_host.host, keyed_host.port), timeout=10) as sock:
        read_body(sock)  # the new challenge, ignored
        sock.sendall(recorded_auth)
        assert_refused_and_closed(sock)
    # The recorded request after a genuine handshake: its counter (2) is the one due, its nonce is not.
    sock, auth, _ = open_session(keyed_host)
    with sock:
        sock.sendall(recorded_request)
        assert_refused_and_closed(sock, auth)
    assert delta(before, refusals(keyed_host)) == {"unauthorized": 2, "bad_mac": 2}


def test_host_frames_are_verified_by_the_device(keyed_host, bundle) -> None:
    """A relay that flips one byte of the host's infer reply: the device refuses it, nothing wrong is returned."""
    cut, _ = cut_tensor(bundle, SPLIT, 1)

    async def go():
        relayed = asyncio.Event()

        async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection(keyed_host.host, keyed_host.port)

            async def upstream() -> None:
                while data := await reader.read(1 << 16):
                    up_writer.write(data)
                up_writer.close()

            async def downstream() -> None:  # host frames: 1 challenge, 2 hello reply, 3 infer reply
                for n in range(1, 4):
                    header = await up_reader.readexactly(4)
                    body = bytearray(await up_reader.readexactly(struct.unpack(">I", header)[0]))
                    if n == 3:
                        body[-1] ^= 0x01
                    writer.write(header + body)

            await asyncio.gather(upstream(), downstream(), return_exceptions=True)
            writer.close()
            relayed.set()

        server = await asyncio.start_server(relay, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            client = await HostClient.connect("127.0.0.1", port, credentials=Credentials(key=KEY))
            try:
                await client.infer(bundle.id, SPLIT, cut)
            finally:
                await client.close()
        finally:
            await asyncio.wait_for(relayed.wait(), 5)
            server.close()

    with pytest.raises(AuthenticationError, match="bad MAC"):
        asyncio.run(go())


def test_refusals_are_counted_and_the_host_keeps_serving(keyed_host, bundle) -> None:
    """After every kind of refusal above, the ``stats`` op (over an authenticated connection) reports
    them, and the host still answers."""
    cut, expected = cut_tensor(bundle, SPLIT, 1)
    with socket.create_connection((keyed_host.host, keyed_host.port), timeout=10) as sock:
        read_body(sock)
        sock.sendall(b"\x00\x00\x00\x05hello")  # garbage: refused, not parsed
        assert_refused_and_closed(sock)

    async def session(client: HostClient):
        return await client.infer(bundle.id, SPLIT, cut), (await client.stats())["stats"]

    result, stats = asyncio.run(with_client(keyed_host, session, Credentials(key=KEY)))
    np.testing.assert_allclose(result.output, expected, atol=ATOL, rtol=0)
    refused = stats["frames_refused"]
    assert set(refused) == {"unauthenticated", "bad_mac", "replayed", "handshake"}
    assert sum(refused.values()) == stats["errors"]["unauthorized"] >= 1
    assert refused["unauthenticated"] >= 1


def test_device_with_a_key_refuses_a_host_without_one(host) -> None:
    with pytest.raises(AuthenticationError, match="sent no authentication challenge within 0.5 s"):
        asyncio.run(with_client(host, lambda c: c.stats(), Credentials(key=KEY), timeout=0.5))


def test_zeroconf_offers_a_device_only_hosts_that_match_its_key(keyed_host, bundle) -> None:
    """The TXT record says auth=1; a device without a key is told it needs one, a device with it connects."""
    async def go():
        async with Advertiser("127.0.0.1", keyed_host.port, [bundle.id], ["127.0.0.1"], name="test-keyed", auth=True):
            adverts = await discover(bundle.id, ["127.0.0.1"], timeout=3)
            with pytest.raises(HostUnavailableError, match=f"127.0.0.1:{keyed_host.port} requires a key"):
                await connect_host(bundle, "auto", ["127.0.0.1"], timeout=3)
            client = await connect_host(bundle, "auto", ["127.0.0.1"], timeout=3, credentials=Credentials(key=KEY))
            await client.close()
            return adverts, client.server_info

    adverts, info = asyncio.run(go())
    assert [(a.port, a.auth) for a in adverts] == [(keyed_host.port, True)]
    assert info["auth"] is True


# --- TLS --------------------------------------------------------------------------------------------


def make_cert(folder: Path, name: str, san: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}", "-addext",
         f"subjectAltName={san}"],
        check=True, capture_output=True, timeout=30,
    )
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Self-signed certificates made now (never committed): the host's, for 127.0.0.1 only, and a stranger's."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: cannot make test certificates (apt install openssl)")
    folder = tmp_path_factory.mktemp("certs")
    return {"host": make_cert(folder, "host", "IP:127.0.0.1"), "stranger": make_cert(folder, "stranger", "IP:127.0.0.1")}


@pytest.fixture(scope="module")
def tls_host(mobilenet_bundle, certs):
    yield from start_host([mobilenet_bundle], tls=server_context(*certs["host"]), key=KEY)


def test_tls_with_hmac_round_trip_equals_plain(tls_host, host, bundle, certs) -> None:
    cut, _ = cut_tensor(bundle, SPLIT, 2)

    async def session(client: HostClient):
        # A 2 MB payload too: many TLS records read into one frame buffer, in place.
        pinged = (await client.request({"op": "ping"}, 10.0, np.ones(2_000_000, np.uint8)))["bytes"]
        output = (await client.infer(bundle.id, SPLIT, cut)).output
        return output, pinged, client._protocol.transport.get_extra_info("cipher")

    secure = Credentials(key=KEY, tls=client_context(certs["host"][0]))
    over_tls, pinged, cipher = asyncio.run(with_client(tls_host, session, secure))
    plain, _, no_cipher = asyncio.run(with_client(host, session))
    np.testing.assert_array_equal(over_tls, plain)
    assert pinged == 2_000_000
    assert cipher is not None and cipher[1] in ("TLSv1.2", "TLSv1.3") and no_cipher is None


def test_tls_alone_round_trip(mobilenet_bundle, bundle, certs) -> None:
    cut, expected = cut_tensor(bundle, SPLIT, 1)
    for tls_only in start_host([mobilenet_bundle], tls=server_context(*certs["host"])):
        credentials = Credentials(tls=client_context(certs["host"][0]))
        result = asyncio.run(with_client(tls_only, lambda c: c.infer(bundle.id, SPLIT, cut), credentials))
        np.testing.assert_allclose(result.output, expected, atol=ATOL, rtol=0)


def test_device_that_does_not_trust_the_certificate_fails_clearly(tls_host, certs, bundle) -> None:
    untrusting = Credentials(key=KEY, tls=client_context(certs["stranger"][0]))
    with pytest.raises(AuthenticationError, match="TLS certificate is not trusted.*--tls-ca"):
        asyncio.run(with_client(tls_host, lambda c: c.stats(), untrusting))
    system_cas = Credentials(key=KEY, tls=ssl.create_default_context())
    with pytest.raises(AuthenticationError, match="not trusted"):
        asyncio.run(with_client(tls_host, lambda c: c.stats(), system_cas))
    # The certificate names 127.0.0.1, not "localhost": the name the device dialled is checked.
    trusting = Credentials(key=KEY, tls=client_context(certs["host"][0]))
    with pytest.raises(AuthenticationError, match="mismatch|doesn't match"):
        asyncio.run(with_client(tls_host, lambda c: c.stats(), trusting, address="localhost"))
    # A plain device gets no answer it can use; the host is unharmed and serves the next one.
    with pytest.raises(HostUnavailableError):
        asyncio.run(with_client(tls_host, lambda c: c.stats(), Credentials(key=KEY), timeout=1.0))
    assert asyncio.run(with_client(tls_host, lambda c: c.stats(), trusting))["ok"] is True


def test_tls_device_against_a_plain_host_fails_clearly(host, certs) -> None:
    with pytest.raises(HostUnavailableError, match="cannot connect"):
        asyncio.run(with_client(host, lambda c: c.stats(), Credentials(tls=client_context(certs["host"][0])),
                                timeout=2.0))


# --- the command lines ------------------------------------------------------------------------------


def key_file(folder: Path, data: bytes = KEY, mode: int = 0o600) -> Path:
    path = folder / "host.key"
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


class FakeAdvertiser:
    """Stands in for zeroconf: records what the host would advertise."""

    seen: list[dict] = []

    def __init__(self, *args, **kwargs) -> None:
        FakeAdvertiser.seen.append(kwargs)
        self.info = type("Info", (), {"name": "fake._splitedge._tcp.local."})()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None


@pytest.mark.parametrize("with_key", [False, True])
def test_split_host_says_whether_frames_are_authenticated(mobilenet_bundle, tmp_path, capsys, monkeypatch,
                                                          with_key) -> None:
    from host_runtime import cli as host_cli

    monkeypatch.setattr(host_cli, "_stop_on_signals", lambda stop, caught: stop.set())  # serve, then stop at once
    monkeypatch.setattr(host_cli, "Advertiser", FakeAdvertiser)
    FakeAdvertiser.seen.clear()
    argv = ["serve", str(mobilenet_bundle), "--interface", "127.0.0.1", "--port", "0"]
    assert host_cli.main(argv + (["--key-file", str(key_file(tmp_path))] if with_key else [])) == 0
    out, err = capsys.readouterr()
    warning = "warning: no --key-file: frames are not authenticated; anyone on this network can use this host"
    assert (warning in err) is not with_key
    assert re.search(r"listening on 127\.0\.0\.1:\d+; frames (not )?authenticated", out)
    assert FakeAdvertiser.seen[0]["auth"] is with_key  # the TXT record's auth


def test_split_host_refuses_an_unusable_key_file(mobilenet_bundle, tmp_path, capsys) -> None:
    from host_runtime import cli as host_cli

    path = key_file(tmp_path, mode=0o644)
    assert host_cli.main(["serve", str(mobilenet_bundle), "--no-zeroconf", "--key-file", str(path)]) == 2
    assert f"split-host: error: key file {path} is readable by every user" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        host_cli.main(["serve", str(mobilenet_bundle), "--tls-cert", str(path)])
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err


def test_split_device_with_the_key_file(keyed_host, mobilenet_bundle, tmp_path, capsys) -> None:
    from device_runtime import cli as device_cli

    argv = ["run", str(mobilenet_bundle), "--camera", "synthetic", "--frames", "2", "--split", SPLIT,
            "--host", f"{keyed_host.host}:{keyed_host.port}", "--verbose"]
    assert device_cli.main(argv + ["--key-file", str(key_file(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(rf"split={SPLIT}\s", out)) == 2 and "fell back" not in out
    assert device_cli.main(argv + ["--key-file", str(key_file(tmp_path, OTHER_KEY))]) == 2
    assert "authentication failed" in capsys.readouterr().err
    assert device_cli.main(argv) == 2
    assert "give this device the host's key (split-device --key-file)" in capsys.readouterr().err
    assert device_cli.main(argv + ["--key-file", str(key_file(tmp_path, b""))]) == 2
    assert "is empty" in capsys.readouterr().err
