"""The config file, ``ledge check-config``, ``ledge --version``, signals."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway import __version__
from gateway.app.config import (
    AuthConfig,
    BleDeviceConfig,
    BluetoothConfig,
    BridgeConfig,
    BridgeRuleConfig,
    BrokerConfig,
    Config,
    GatewayConfig,
    GattCharacteristicConfig,
    GattFieldConfig,
    HealthConfig,
    HomeAssistantConfig,
    HTTPConfig,
    ListenerConfig,
    LogConfig,
    MqttSnConfig,
    MqttSnSerialConfig,
    MqttSnUdpConfig,
    ReadingsConfig,
    SerialConfig,
    StoreConfig,
    TapsConfig,
    parse_config,
    parse_listen,
    reloadable_fields,
)
from gateway.app.runtime import ConfigError, RuntimeConfig
from tests.support.clients import Paho
from tests.support.procs import REPO, LedgeProcess
from tests.support.wait import wait_for

EXAMPLE = REPO / "ledge.example.toml"


def ledge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )


def test_version() -> None:
    out = ledge("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"ledge {__version__}"


def test_help_lists_commands() -> None:
    out = ledge("--help")
    assert out.returncode == 0
    assert "run" in out.stdout and "check-config" in out.stdout
    run_help = ledge("run", "--help")
    for flag in ("--config", "--listen", "--data-dir", "--log-level"):
        assert flag in run_help.stdout


def test_empty_config_is_the_embedded_default() -> None:
    config = parse_config("")
    assert config == Config()
    assert [(lc.host, lc.port) for lc in config.listeners] == [("127.0.0.1", 1883)]
    assert config.auth.allow_anonymous


def test_example_config_is_valid_and_shows_every_default() -> None:
    text = EXAMPLE.read_text()
    assert parse_config(text, str(EXAMPLE)) == Config()
    assert ledge("check-config", str(EXAMPLE)).returncode == 0


SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("", Config),
    ("[[listeners]]", ListenerConfig),
    ("[broker]", BrokerConfig),
    ("[store]", StoreConfig),
    ("[gateway]", GatewayConfig),
    ("[readings]", ReadingsConfig),
    ("# [[serial]]", SerialConfig),
    ("[bluetooth]", BluetoothConfig),
    ("# [[ble]]", BleDeviceConfig),
    ("# [[ble.characteristics]]", GattCharacteristicConfig),
    ("# [[ble.characteristics.fields]]", GattFieldConfig),
    ("[homeassistant]", HomeAssistantConfig),
    ("[taps]", TapsConfig),
    ("# [[bridges]]", BridgeConfig),
    ("# [[bridges.rules]]", BridgeRuleConfig),
    ("[mqttsn]", MqttSnConfig),
    ("# [[mqttsn.udp]]", MqttSnUdpConfig),
    ("# [[mqttsn.serial]]", MqttSnSerialConfig),
    ("[auth]", AuthConfig),
    ("[log]", LogConfig),
    ("# [http]", HTTPConfig),
    ("[health]", HealthConfig),
]


@pytest.mark.parametrize(("header", "model"), SECTIONS, ids=[s[0] or "top" for s in SECTIONS])
def test_example_config_documents_every_option_and_its_reload(
    header: str, model: type[BaseModel]
) -> None:
    text = EXAMPLE.read_text()
    if header:
        start = text.index("\n" + header + "\n")
        rest = text[start + len(header) + 2 :]
        nxt = re.search(r"^\[", rest, re.M)
        section = rest[: nxt.start()] if nxt else rest
    else:
        section = text[: text.index("\n[")]
    for name, reload in reloadable_fields(model).items():
        if name in (
            "listeners",
            "broker",
            "store",
            "auth",
            "log",
            "gateway",
            "readings",
            "serial",
            "homeassistant",
            "taps",
            "bridges",
            "http",
            "bluetooth",
            "ble",
            "mqttsn",
            "health",
        ):
            continue
        m = re.search(rf"^((?:#.*\n)+)#? ?{name} = ", section, re.M)
        assert m, f"{header or 'top level'}: option {name} is not documented"
        comments = m.group(1)
        said = re.findall(r"reload: (yes|no)", comments)
        assert said, f"{name}: no 'reload:' note"
        assert said[-1] == ("yes" if reload else "no"), f"{name}: reload note is wrong"


def _section_text(header: str) -> str:
    text = EXAMPLE.read_text()
    if not header:
        return text[: text.index("\n[")]
    start = text.index("\n" + header + "\n")
    rest = text[start + len(header) + 2 :]
    nxt = re.search(r"^\[", rest, re.M)
    return rest[: nxt.start()] if nxt else rest


@pytest.mark.parametrize(("header", "model"), SECTIONS, ids=[s[0] or "top" for s in SECTIONS])
def test_example_config_shows_every_option_at_its_real_default(
    header: str, model: type[BaseModel]
) -> None:
    """The value the example shows for an option is the default the gateway uses (the
    settings dataclasses define it; the model is made from them). An option without a
    fixed default (unset, or the host name) is shown commented out, as an example."""
    section = _section_text(header)
    checked = 0
    for name, info in model.model_fields.items():
        if isinstance(info.default_factory, type) or (
            info.annotation is not None and "Config" in str(info.annotation)
        ):
            continue  # a table of its own
        m = re.search(rf"^(# ?)?{name} = (.*)$", section, re.M)
        assert m, f"{header or 'top level'}: option {name} is not shown"
        commented, shown = m.group(1) is not None, tomllib.loads(f"v = {m.group(2)}")["v"]
        if info.is_required():
            continue  # no default: any example value
        factory = info.default_factory
        default = factory() if factory is not None else info.default  # type: ignore[call-arg]
        if default is None or name == "id":
            assert commented, f"{name}: has no fixed default but is set in the example"
            continue
        if isinstance(default, list | tuple):
            default, shown = list(default), list(shown)
        assert shown == default, f"{header or 'top level'}: {name} = {shown!r}, default {default!r}"
        checked += 1
    assert checked or header in ("",), "nothing compared"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[[listeners]]\nport = 1\n[[listeners]]\nport = 99999\n",
            r"listeners\[1\]\.port \(line 4\): .*less than or equal to 65535",
        ),
        ("[broker]\nmax_packet_size = 'big'\n", r"broker\.max_packet_size \(line 2\): .*integer"),
        ("[broker]\nmax_conections = 5\n", r"broker\.max_conections \(line 2\): unknown option"),
        (
            "[broker]\ndeny_subscriptions = ['a/#/b']\n",
            r"broker\.deny_subscriptions \(line 2\): .*'#' must be the last level",
        ),
        ("[log]\nlevel = 'loud'\n", r"log\.level \(line 2\): "),
        ("[http]\nport = 70000\n", r"http\.port \(line 2\): .*65535"),
        ("[http]\ncertfile = '/etc/hostname'\n", r"http \(line 1\): .*certfile and keyfile go"),
        ("[http]\ntoken_file = '/nonexistent'\n", r"http\.token_file \(line 2\): .*cannot read"),
        ("[http]\nmax_header_bytes = 100\n", r"http\.max_header_bytes \(line 2\): .*1024"),
        ("[broker\n", r"TOML syntax error: .*line 1"),
    ],
)
def test_config_errors_name_key_path_and_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "test.toml")
    assert re.search(expected, str(info.value)), str(info.value)
    assert str(info.value).startswith("test.toml: ")


def test_an_http_token_must_be_long_enough(tmp_path: Path) -> None:
    short = tmp_path / "token"
    short.write_text("tooshort\n")
    with pytest.raises(ConfigError, match=r"http\.token_file .*shorter than 16"):
        parse_config(f"[http]\ntoken_file = '{short}'\n", "t.toml")
    short.write_text("  a-token-of-twenty-chars  \n# comment\n")
    config = parse_config(f"[http]\nenabled = true\ntoken_file = '{short}'\n", "t.toml")
    http = config.to_runtime().http
    assert http is not None and http.token_file == str(short)


def test_check_config_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[[listeners]]\nhost = "0.0.0.0"\nport = 1884\n')
    ok = ledge("check-config", str(good))
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("[[listeners]]\nport = 1\n[[listeners]]\nport = -1\n")
    out = ledge("check-config", str(bad))
    assert out.returncode == 2
    assert "listeners[1].port (line 4)" in out.stderr
    missing = ledge("check-config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr


def test_check_config_reads_the_password_file(tmp_path: Path) -> None:
    bad_pw = tmp_path / "passwd"
    bad_pw.write_text("alice:$7$101$bm90YmFzZTY0!!$xx\n")
    config = tmp_path / "c.toml"
    config.write_text(f'[auth]\npassword_file = "{bad_pw}"\n')
    out = ledge("check-config", str(config))
    assert out.returncode == 0  # the line is skipped, the file serves (and says so)
    assert f"password file {bad_pw} line 1: user 'alice'" in out.stderr
    assert "line skipped" in out.stderr


def test_run_refuses_a_broken_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[broker]\nmax_connections = 0\n")
    out = ledge("run", "--config", str(bad))
    assert out.returncode == 2
    assert "broker.max_connections (line 2)" in out.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:1883", ("127.0.0.1", 1883)),
        (":8883", ("0.0.0.0", 8883)),
        ("[::1]:1", ("::1", 1)),
    ],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["1883", "host:x", "host:70000"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_listen(text)


def test_flags_override_the_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[log]\nlevel = "error"\n[[listeners]]\nport = 1\n')
    proc = LedgeProcess("--log-level", "info", config=config).start()
    try:
        assert proc.port not in (0, 1)
    finally:
        assert proc.stop() == 0


def test_sigterm_sends_v5_clients_disconnect_0x8b_and_exits_0(ledge: LedgeProcess) -> None:
    five = Paho(ledge.port, "term5").connect()
    three = Paho(ledge.port, "term3", 4).connect()
    ledge.signal(signal.SIGTERM)
    wait_for(lambda: five.disconnects, 5, "DISCONNECT at the v5 client")
    assert five.disconnects[0] == 0x8B
    wait_for(lambda: three.disconnects, 5, "the 3.1.1 connection to close")
    assert ledge.stop() == 0
    assert "shutting down" in ledge.log


def test_sighup_reloads_deny_list(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[broker]\ndeny_subscriptions = []\n")
    proc = LedgeProcess(config=config).start()
    try:
        c = Paho(proc.port, "reloader").connect()
        assert c.subscribe("later/denied", 1) == [1]
        config.write_text('[broker]\ndeny_subscriptions = ["later/#"]\nreceive_maximum = 5\n')
        proc.signal(signal.SIGHUP)
        line = proc.wait_log("config reloaded", 20)
        assert "deny_subscriptions" in line
        assert "restart needed for: receive_maximum" in line
        assert c.subscribe("later/denied", 1) == [0x80]
        c.disconnect()
    finally:
        assert proc.stop() == 0


def test_sighup_with_broken_file_keeps_running_config(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("")
    proc = LedgeProcess(config=config).start()
    try:
        config.write_text("[broker]\nmax_inflight = -3\n")
        proc.signal(signal.SIGHUP)
        proc.wait_log(r"reload failed, keeping the running config", 20)
        proc.wait_log(r"broker\.max_inflight \(line 2\)", 20)
        c = Paho(proc.port, "still-alive").connect()
        c.disconnect()
    finally:
        assert proc.stop() == 0


def test_runtime_config_round_trips_through_json() -> None:
    config = parse_config(EXAMPLE.read_text())
    runtime = config.to_runtime(EXAMPLE)
    assert RuntimeConfig.from_json(runtime.to_json()) == runtime
    assert runtime.broker == config.broker_settings()
    assert "deny_subscriptions" in runtime.reloadable
    assert "max_connections" not in runtime.reloadable


def test_the_gateway_process_does_not_carry_pydantic(ledge: LedgeProcess) -> None:
    """``ledge run`` validates, then execs a process that never imports pydantic."""
    assert ledge.proc is not None
    maps = Path(f"/proc/{ledge.proc.pid}/maps").read_text()
    assert "pydantic_core" not in maps
    assert "gateway.app" in Path(f"/proc/{ledge.proc.pid}/cmdline").read_text()
