"""device.toml files, then SPLITEDGE_* variables, then flags: later wins, each value checked as its flag is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from device_runtime import cli
from device_runtime.board._settings import apply_settings, config_files
from device_runtime.bundle import BOARD_PART
from device_runtime._bundle_slice import slice_bundle
from splitedge.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    system, user = tmp_path / "etc", tmp_path / "user"
    system.mkdir()
    user.mkdir()
    return system, user


def env_for(system: Path, user: Path, **variables: str) -> dict[str, str]:
    return {"SPLITEDGE_CONFIG_DIRS": f"{system}{os.pathsep}{user}", **variables}


def settle(argv: list[str], environ: dict[str, str]):
    args = cli.build_parser().parse_args(argv)
    settings = apply_settings(args, argv, cli.build_parser, environ)
    return args, settings


def test_later_wins_and_each_value_says_where_it_came_from(dirs) -> None:
    system, user = dirs
    (system / "device.toml").write_text('host = "10.0.0.1:7767"\nkey_file = "/etc/splitedge/host.key"\n'
                                        'threads = 4\ncamera = 0\ninterface = ["10.0.0.5", "10.0.1.5"]\n')
    (user / "device.toml").write_text('host = "10.0.0.2:7767"\nthreads = 2\n')
    environ = env_for(system, user, SPLITEDGE_THREADS="3", SPLITEDGE_TLS_CA="/home/pi/ca.pem")
    args, settings = settle(["run", "bundle/", "--tls-ca", "mine.pem", "--interface", "127.0.0.1"], environ)
    assert (args.host, args.key_file, args.threads, args.camera) == ("10.0.0.2:7767", "/etc/splitedge/host.key", 3, "0")
    assert (args.tls_ca, args.interface) == ("mine.pem", ["127.0.0.1"])  # a flag replaces the file's list
    sources = {name: s.source for name, s in settings.values.items()}
    assert sources == {
        "host": str(user / "device.toml"), "key_file": str(system / "device.toml"), "threads": "env SPLITEDGE_THREADS",
        "tls_ca": "flag --tls-ca", "camera": str(system / "device.toml"), "interface": "flag --interface",
    }


def test_calibrate_takes_what_applies_to_it(dirs) -> None:
    system, user = dirs
    (system / "device.toml").write_text('host = "10.0.0.1:7767"\ncamera = "picam"\nbatch = 4\n')
    args, _ = settle(["calibrate", "bundle/"], env_for(system, user))
    assert args.host == "10.0.0.1:7767"
    assert args.batch == (1, 2, 4, 8, 16)  # run's frames per head run is not calibrate's list of batch sizes
    assert args.camera is None  # the file's camera is run's; calibrate takes one only as its own --camera


@pytest.mark.parametrize("text, message", [
    ('hots = "10.0.0.1:7767"\n', "unknown key 'hots' (did you mean host?)"),
    ('threads = "four"\n', "threads: expected an integer, got 'four'"),
    ("timeout = true\n", "timeout: expected a number, got True"),
    ('backend = "coreml"\n', "backend: expected one of auto, onnx, tflite, got 'coreml'"),
    ('host = "10.0.0.1"\n', "host: "),
    ("host = \n", "not valid TOML"),
    ('interface = [1, 2]\n', "interface: expected a string or a list of them, got [1, 2]"),
])
def test_a_bad_file_is_one_line_naming_file_and_key(dirs, text: str, message: str) -> None:
    system, user = dirs
    (user / "device.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        settle(["run", "bundle/"], env_for(system, user))
    assert str(info.value).startswith(f"{user / 'device.toml'}: ")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_bad_variable_is_named(dirs) -> None:
    with pytest.raises(ConfigError, match="environment variable SPLITEDGE_THREADS: threads: .*got 'x'"):
        settle(["run", "bundle/"], env_for(*dirs, SPLITEDGE_THREADS="x"))


def test_default_files_are_etc_then_the_users(tmp_path: Path) -> None:
    assert config_files({"HOME": "/home/pi"}) == [Path("/etc/splitedge/device.toml"),
                                                   Path("/home/pi/.config/splitedge/device.toml")]
    assert config_files({"HOME": "/home/pi", "XDG_CONFIG_HOME": "/cfg"})[1] == Path("/cfg/splitedge/device.toml")


def device(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "device_runtime.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=180, env={**os.environ, **env})


def test_split_device_config_prints_values_and_sources(dirs) -> None:
    system, user = dirs
    (system / "device.toml").write_text('host = "10.0.0.1:7767"\n')
    out = device("config", env=env_for(system, user, SPLITEDGE_CAMERA="picam"))
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line.split() for line in out.stdout.splitlines()}
    assert lines["host"][1:] == ["10.0.0.1:7767", str(system / "device.toml")]
    assert lines["camera"][1:] == ["picam", "env", "SPLITEDGE_CAMERA"]
    assert lines["batch"][1:] == ["1", "default"]
    data = json.loads(device("config", "--json", env=env_for(system, user)).stdout)
    assert data["settings"]["host"] == {"value": "10.0.0.1:7767", "source": str(system / "device.toml")}
    assert data["files_read"] == [str(system / "device.toml")] and data["files_absent"] == [str(user / "device.toml")]


def test_a_bad_file_stops_run_with_one_line(dirs) -> None:
    system, user = dirs
    (system / "device.toml").write_text("threads = -\n")
    out = device("run", "bundle/", env=env_for(system, user))
    assert out.returncode == 2
    assert out.stderr.startswith(f"split-device: error: {system / 'device.toml'}: not valid TOML")


def test_run_takes_its_flags_from_the_file(dirs, mobilenet_bundle: Path, photos_dir: Path, tmp_path: Path) -> None:
    system, user = dirs
    slice_bundle(mobilenet_bundle, tmp_path / "board", BOARD_PART)
    (user / "device.toml").write_text(f'split = "local"\nthreads = 1\ncamera = "{photos_dir}"\n')
    out = device("run", str(tmp_path / "board"), "--verbose", env=env_for(system, user))
    assert out.returncode == 0, out.stderr
    assert ", 1 threads, split local" in out.stdout
    assert sum("split=local" in line for line in out.stdout.splitlines()) == 4


def test_config_set_writes_checked_values_and_keeps_the_other_keys(dirs) -> None:
    system, user = dirs
    (user / "device.toml").write_text('threads = 2\nsplit = "local"\n')
    env = env_for(system, user)
    out = device("config", "--set", "host=10.0.0.7:7767", "--set", "camera=0", "--set", "interface=wlan0,eth0",
                 "--set", "deadline_ms=40.5", "--unset", "split", env=env)
    assert out.returncode == 0, out.stderr
    assert f"{user / 'device.toml'}: host = '10.0.0.7:7767' (was None)" in out.stdout
    data = json.loads(device("config", "--json", env=env).stdout)["settings"]
    assert data["host"]["value"] == "10.0.0.7:7767" and data["threads"]["value"] == 2
    assert data["interface"]["value"] == ["wlan0", "eth0"] and data["deadline_ms"]["value"] == 40.5
    assert data["split"]["source"] == "default"
    assert data["camera"]["value"] in (0, "0") and "camera = 0\n" in (user / "device.toml").read_text()
    assert [p.name for p in user.iterdir()] == ["device.toml"]  # no temporary file left beside it


@pytest.mark.parametrize("argv, message", [
    (["--set", "threads=many"], "--set threads: threads: expected a whole number from 1 to 256, like 4, got 'many'"),
    (["--set", "threads=100000"], "--set threads: threads: expected a whole number from 1 to 256, like 4, got '100000'"),
    (["--set", "batch=0"], "--set batch: batch: expected a whole number from 1 to 1024, like 4, got '0'"),
    (["--set", "batch=-3"], "--set batch: batch: expected a whole number from 1 to 1024"),
    (["--set", "timeout=nan"], "--set timeout: timeout: expected seconds above 0 up to 3600, like 5, got 'nan'"),
    (["--set", "timeout=inf"], "--set timeout: timeout: expected seconds above 0 up to 3600, like 5, got 'inf'"),
    (["--set", "frame=100000x100000"], "--set frame: frame: frame size '100000x100000': expected WIDTHxHEIGHT in "
                                       "pixels, each side from 1 to 8192"),
    (["--set", "timeout=-5"], "--set timeout: timeout: expected seconds above 0 up to 3600, like 5, got '-5'"),
    (["--set", "timeout=0"], "--set timeout: timeout: expected seconds above 0 up to 3600, like 5, got '0'"),
    (["--set", "camera=a\udcffb"], "--set camera: camera: 'a\\udcffb' is not valid UTF-8 text"),
    (["--set", "hots=1.2.3.4:1"], "unknown key 'hots' (did you mean host?)"),
    (["--set", "host"], "--set 'host': expected KEY=VALUE"),
])
def test_config_set_refuses_what_the_flag_would_and_leaves_the_file(dirs, argv: list[str], message: str) -> None:
    system, user = dirs
    (user / "device.toml").write_text("threads = 2\n")
    out = device("config", *argv, env=env_for(system, user))
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert (user / "device.toml").read_text() == "threads = 2\n"


@pytest.mark.parametrize("key, value, message", [
    ("SPLITEDGE_BATCH", "0", "environment variable SPLITEDGE_BATCH: batch: expected a whole number from 1 to 1024"),
    ("SPLITEDGE_TIMEOUT", "nan", "environment variable SPLITEDGE_TIMEOUT: timeout: expected seconds above 0 up to 3600"),
])
def test_the_environment_is_checked_as_the_flags_are(dirs, key: str, value: str, message: str) -> None:
    system, user = dirs
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        settle(["run", "bundle/"], env_for(system, user, **{key: value}))


@pytest.mark.parametrize("flag, value", [("--batch", "0"), ("--timeout", "nan"), ("--timeout", "-5"), ("--threads", "100000")])
def test_the_flags_refuse_what_the_files_refuse(flag: str, value: str) -> None:
    out = device("run", "bundle/", flag, value, env={})
    assert out.returncode == 2 and "expected " in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("text", [
    b"camera = 0\nhost = \nthreads = 3\n",  # a broken line amid good ones
    b"x = " + b"[" * 5000 + b"]" * 5000 + b"\nthreads = 3\n",  # nested too deep for the reader
    b'camera = "\xff"\nthreads = 3\n',  # not UTF-8: a UnicodeDecodeError traceback once (issue 45)
])
def test_a_broken_file_is_one_line_and_set_repairs_it(dirs, text: bytes) -> None:
    system, user = dirs
    path = user / "device.toml"
    path.write_bytes(text)
    shown = device("config", env=env_for(system, user))
    assert shown.returncode == 2 and str(path) in shown.stderr and "--set" in shown.stderr
    assert len(shown.stderr.strip().splitlines()) == 1 and "Traceback" not in shown.stderr
    fixed = device("config", "--set", "batch=2", env=env_for(system, user))
    assert fixed.returncode == 0, fixed.stderr
    data = json.loads(device("config", "--json", env=env_for(system, user)).stdout)["settings"]
    assert data["batch"]["value"] == 2 and data["threads"]["value"] == 3  # the lines that read are kept


def test_a_settings_file_past_its_cap_is_one_line_unread_and_a_fifo_is_no_file(dirs) -> None:
    system, user = dirs
    path = user / "device.toml"
    path.write_bytes(b"#" * (2**20 + 1))
    for argv in (["config"], ["config", "--set", "batch=2"]):
        shown = device(*argv, env=env_for(system, user))
        assert shown.returncode == 2 and "longer than 1,048,576 bytes" in shown.stderr, shown.stderr
        assert len(shown.stderr.strip().splitlines()) == 1 and "Traceback" not in shown.stderr
    path.unlink()
    os.mkfifo(path)  # never opened: it would wait for a writer
    shown = device("config", env=env_for(system, user))
    assert shown.returncode == 0 and "absent: " in shown.stdout and str(path) in shown.stdout, shown.stderr


def test_set_writes_text_a_reader_loads_back(dirs) -> None:
    """Quotes, backslashes and non-ASCII text go through the TOML writer, not string pasting."""
    system, user = dirs
    odd = 'cam "1" \\ é'
    assert device("config", "--set", f"camera={odd}", env=env_for(system, user)).returncode == 0
    data = json.loads(device("config", "--json", env=env_for(system, user)).stdout)["settings"]
    assert data["camera"]["value"] == odd


@pytest.mark.parametrize(("where", "expected"), [
    ([], "auto"),  # not given: a live camera's frame interval, once the camera is open
    (["--deadline-ms", "0"], None),  # the flag's 0 is "none", and None is how the code says it
    (["--deadline-ms", "40.5"], 40.5),
    ("deadline_ms = 0", None),  # a file's 0 is the flag's
    ("SPLITEDGE_DEADLINE_MS=0", None),  # and so is the environment's
])
def test_deadline_ms_0_is_none_in_the_settings(dirs, where: list[str] | str, expected: float | str | None) -> None:
    """``--deadline-ms 0`` (from a flag, a file or the environment) reaches the run as None, converted
    once by run_settings: nothing after it reads 0 as "none" (on the wire 0 is a budget already spent)."""
    from device_runtime.board.run_settings import run_settings
    from device_runtime.stream._pipeline import PipelineConfig

    system, user = dirs
    variables: dict[str, str] = {}
    if isinstance(where, str) and where.startswith("SPLITEDGE_"):
        name, value = where.split("=")
        variables[name] = value
    elif isinstance(where, str):
        (system / "device.toml").write_text(where + "\n")
    args, _ = settle(["run", "bundle/", *(where if isinstance(where, list) else [])], env_for(system, user, **variables))
    settings = run_settings(args)
    assert settings.deadline_ms == expected
    assert settings.given_deadline_ms == (None if expected == "auto" else expected)
    assert PipelineConfig(deadline_ms=settings.deadline_ms).deadline_ms == expected


@pytest.mark.parametrize("spent", [0, 0.0, -5.0])
def test_the_pipeline_takes_no_0_for_none(spent: float) -> None:
    """A deadline of 0 in the code is a budget already spent, not "none": the pipeline refuses it
    rather than send every frame to be refused."""
    from device_runtime.stream._pipeline import PipelineConfig

    with pytest.raises(ValueError, match="deadline_ms must be above 0 ms"):
        PipelineConfig(deadline_ms=spent)
