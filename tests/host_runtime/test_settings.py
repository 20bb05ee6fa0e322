"""``HostSettings``: the one place ``split-host serve``'s flags become what the host runs with (issue 46)."""

from __future__ import annotations

import pytest

from host_runtime.cli import build_parser
from host_runtime._settings import HostSettings
from splitedge import SettingError


def _settings(*flags: str) -> HostSettings:
    return HostSettings.from_args(build_parser().parse_args(["serve", "bundle/", *flags]))


def test_the_server_config_is_the_flags_as_the_server_takes_them() -> None:
    settings = _settings("--max-frame-mb", "8", "--drain-timeout", "2", "--profile-budget-ms", "250", "--share-queue",
                         "on", "--peer", "10.0.0.2:7767", "--no-zeroconf", "--metrics-port", "9100")
    config = settings.server_config(workers=3, max_connections=100, buckets=(), key=None, tls=None, child_port=None)
    assert not settings.zeroconf and settings.peers == ("10.0.0.2:7767",)
    assert config.max_frame_bytes == 8 << 20 and config.max_partial_bytes == 32 << 20  # 4 frames by default
    assert config.shutdown_timeout == 2.0 and config.profile_budget_s == 0.25 and config.batching.share is True
    assert (config.workers, config.max_connections, config.port, config.reuse_port) == (3, 100, 7767, False)
    assert (config.metrics_host, config.metrics_port) == ("127.0.0.1", 9100)


def test_a_procs_child_listens_on_the_shared_port_and_keeps_its_metrics_on_loopback() -> None:
    settings = _settings("--metrics-port", "9100", "--procs", "2")
    config = settings.server_config(workers=1, max_connections=10, buckets=(), key=None, tls=None, child_port=40000)
    assert (config.port, config.reuse_port, config.metrics_host, config.metrics_port) == (40000, True, "127.0.0.1", 0)


@pytest.mark.parametrize(("flags", "says"), [
    (("--tls-cert", "cert.pem"), "--tls-cert and --tls-key go together"),
    (("--max-frame-mb", "64", "--max-partial-mb", "32"), "--max-partial-mb 32 cannot hold one frame of --max-frame-mb 64"),
    (("--live", "8080", "--procs", "2"), "--live shows one process's connections and queue: use it with --procs 1"),
    (("--metrics-port", "9100", "--metrics-interface", "0.0.0.0"), "--metrics-interface 0.0.0.0 is not loopback"),
])
def test_flags_that_contradict_each_other_are_one_line(flags: tuple[str, ...], says: str) -> None:
    with pytest.raises(SettingError, match=f"^{says}"):
        _settings(*flags)
