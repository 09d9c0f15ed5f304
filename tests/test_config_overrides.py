"""Command-line flags over the file (``Overrides``), the addresses they and the bridges
give (``parse_listen``, ``parse_remote``), and the validated file turned into the
gateway's plain data (``Config.to_runtime``). In-process, no gateway started."""

from __future__ import annotations

import locale
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.app.config import (
    Config,
    ListenerConfig,
    Overrides,
    load_config,
    parse_config,
    parse_listen,
    parse_remote,
    reloadable_fields,
)
from gateway.app.runtime import AuthSettings, ConfigError, RuntimeConfig
from gateway.bridge.settings import RuleSettings, TlsSettings


@pytest.fixture
def ascii_locale() -> Iterator[None]:
    """A system whose locale is not UTF-8: the config is still read as UTF-8."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


# ----------------------------------------------------------------------- Overrides.args


def test_flags_are_written_back_as_the_command_line_gave_them() -> None:
    overrides = Overrides(
        listen=(("0.0.0.0", 1883), ("::1", 8883), ("", 1)),
        data_dir=Path("/var/lib/ledge"),
        log_level="debug",
    )
    args = overrides.args()
    assert args == (
        "--listen",
        "0.0.0.0:1883",
        "--listen",
        "[::1]:8883",
        "--listen",
        ":1",
        "--data-dir",
        "/var/lib/ledge",
        "--log-level",
        "debug",
    )
    # ... and read back to the same addresses (an IPv6 host keeps its brackets).
    assert [parse_listen(a) for a in args[1:6:2]] == [
        ("0.0.0.0", 1883),
        ("::1", 8883),
        ("0.0.0.0", 1),
    ]


def test_each_flag_alone_is_written_back_alone() -> None:
    assert Overrides().args() == ()
    assert Overrides(data_dir=Path("d")).args() == ("--data-dir", "d")
    assert Overrides(log_level="error").args() == ("--log-level", "error")
    assert Overrides(listen=(("h", 2),), log_level="info").args() == (
        "--listen",
        "h:2",
        "--log-level",
        "info",
    )
    assert Overrides(listen=(("h", 2),), data_dir=Path("/d")).args() == (
        "--listen",
        "h:2",
        "--data-dir",
        "/d",
    )


# ----------------------------------------------------------------------- Overrides.apply

FILE = """
data_dir = "/from/file"
[[listeners]]
host = "10.0.0.1"
port = 1
name = "file"
[auth]
allow_anonymous = false
[log]
level = "error"
"""


def test_flags_replace_what_the_file_says() -> None:
    config = parse_config(FILE)
    overrides = Overrides(
        listen=(("0.0.0.0", 1884), ("::", 1885)), data_dir=Path("/flag"), log_level="debug"
    )
    applied = overrides.apply(config)
    assert applied.listeners == [
        ListenerConfig.model_validate({"host": "0.0.0.0", "port": 1884}),
        ListenerConfig.model_validate({"host": "::", "port": 1885}),
    ]
    runtime = applied.to_runtime(Path("/etc/ledge.toml"), overrides)
    assert [(lc.host, lc.port, lc.name) for lc in runtime.listeners] == [
        ("0.0.0.0", 1884, ""),
        ("::", 1885, ""),
    ]
    # A listener from the command line follows [auth] like one from the file.
    assert [lc.allow_anonymous for lc in runtime.listeners] == [False, False]
    assert runtime.data_dir == "/flag"
    assert runtime.log_level == "debug"
    assert runtime.config_path == "/etc/ledge.toml"
    assert runtime.override_args == overrides.args()
    # The file's config itself is left as it was.
    assert config.to_runtime().data_dir == "/from/file"
    assert config.to_runtime().log_level == "error"


def test_each_flag_changes_only_its_own_option() -> None:
    config = parse_config(FILE)
    only_dir = Overrides(data_dir=Path("/flag")).apply(config).to_runtime()
    assert only_dir.data_dir == "/flag"
    assert only_dir.log_level == "error"
    assert [(lc.host, lc.port) for lc in only_dir.listeners] == [("10.0.0.1", 1)]
    only_level = Overrides(log_level="warning").apply(config).to_runtime()
    assert (only_level.data_dir, only_level.log_level) == ("/from/file", "warning")
    only_listen = Overrides(listen=(("h", 2),)).apply(config).to_runtime()
    assert [(lc.host, lc.port) for lc in only_listen.listeners] == [("h", 2)]
    assert (only_listen.data_dir, only_listen.log_level) == ("/from/file", "error")


def test_no_flags_leave_the_config_as_it_is() -> None:
    config = parse_config(FILE)
    assert Overrides().apply(config) is config


def test_a_bad_flag_value_is_refused_like_a_bad_file_value() -> None:
    with pytest.raises(ValueError, match="65535"):
        Overrides(listen=(("h", 70000),)).apply(Config())
    with pytest.raises(ValueError, match="level"):
        Overrides(log_level="loud").apply(Config())


# ----------------------------------------------------------------------- parse_listen


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (":0", ("0.0.0.0", 0)),
        ("h:65535", ("h", 65535)),
        ("[fe80::1]:1", ("fe80::1", 1)),
        ("[::]:2", ("::", 2)),
        # Only a bracketed host loses its brackets.
        ("[abc:3", ("[abc", 3)),
        ("abc]:4", ("abc]", 4)),
    ],
)
def test_parse_listen_bounds(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1883", "'1883' is not HOST:PORT"),
        ("h:x", "'h:x': port 'x' is not a number"),
        ("h:", "'h:': port '' is not a number"),
        ("h:65536", "'h:65536': port 65536 is outside 0..65535"),
        ("h:-1", "'h:-1': port -1 is outside 0..65535"),
    ],
)
def test_parse_listen_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_listen(text)
    assert str(info.value) == message


# ----------------------------------------------------------------------- parse_remote


@pytest.mark.parametrize(
    ("text", "tls", "expected"),
    [
        ("broker", False, ("broker", 1883)),
        ("broker", True, ("broker", 8883)),
        ("broker:1884", True, ("broker", 1884)),
        ("broker:1", False, ("broker", 1)),
        ("broker:65535", False, ("broker", 65535)),
        ("[::1]", False, ("::1", 1883)),
        ("[::1]", True, ("::1", 8883)),
        ("[fe80::1]:1884", False, ("fe80::1", 1884)),
        ("10.0.0.1:8883", False, ("10.0.0.1", 8883)),
        # Only a bracketed host loses its brackets.
        ("[abc", False, ("[abc", 1883)),
        ("abc]", False, ("abc]", 1883)),
    ],
)
def test_parse_remote(text: str, tls: bool, expected: tuple[str, int]) -> None:
    assert parse_remote(text, tls) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (":1883", "address ':1883' has no host"),
        ("[]", "address '[]' has no host"),
        ("h:0", "address 'h:0': port '0' is not 1..65535"),
        ("h:65536", "address 'h:65536': port '65536' is not 1..65535"),
        ("h:x", "address 'h:x': port 'x' is not 1..65535"),
        ("h:-1", "address 'h:-1': port '-1' is not 1..65535"),
    ],
)
def test_parse_remote_says_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_remote(text, False)
    assert str(info.value) == message


# ----------------------------------------------------------------------- bridges

BRIDGES = """
[[bridges]]
name = "cloud"
address = "cloud.example"
addresses = ["backup:1884", "[::1]"]
[bridges.tls]
enabled = true
[[bridges.rules]]
filter = "a/#"
[[bridges.rules]]
filter = "b/#"
direction = "in"
[[bridges]]
name = "Xlocal"
addresses = ["10.0.0.2"]
[[bridges.rules]]
filter = "c/#"
"""


def test_a_bridge_s_remote_addresses_are_parsed_with_its_tls_default_port() -> None:
    runtime = parse_config(BRIDGES).to_runtime()
    cloud, local = runtime.bridges
    assert cloud.addresses == (("cloud.example", 8883), ("backup", 1884), ("::1", 8883))
    assert cloud.tls == TlsSettings(enabled=True)
    assert cloud.rules == (RuleSettings("a/#"), RuleSettings("b/#", direction="in"))
    assert local.name == "Xlocal"
    assert local.addresses == (("10.0.0.2", 1883),)
    assert local.tls == TlsSettings()
    assert RuntimeConfig.from_json(runtime.to_json()) == runtime


def test_a_bridge_address_that_cannot_be_parsed_is_named() -> None:
    text = BRIDGES.replace('"backup:1884"', '"backup:0"')
    with pytest.raises(ConfigError) as info:
        parse_config(text, "b.toml")
    assert info.value.problems == [
        "bridges[0] (line 2): Value error, address 'backup:0': port '0' is not 1..65535"
    ]


# ----------------------------------------------------------------------- to_runtime


def test_listeners_broker_and_auth_come_out_resolved(tmp_path: Path) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic a\n")
    pw = tmp_path / "pw"
    pw.write_text("")
    config = parse_config(
        "[[listeners]]\nport = 1\n"
        "[[listeners]]\nport = 2\nallow_anonymous = true\n"
        f"[auth]\nallow_anonymous = false\npassword_file = '{pw}'\nacl_file = '{acl}'\n"
        "failed_login_delay = 2.5\nfailed_login_delay_max = 7.0\n"
        "[broker]\nmax_connections = 77\n"
    )
    runtime = config.to_runtime()
    assert runtime.auth == AuthSettings(False, str(pw), str(acl))
    assert (runtime.allow_anonymous, runtime.password_file, runtime.acl_file) == (
        False,
        str(pw),
        str(acl),
    )
    first, second = runtime.listeners
    assert (first.port, first.allow_anonymous, first.password_file, first.acl_file) == (
        1,
        False,
        str(pw),
        str(acl),
    )
    assert (second.port, second.allow_anonymous) == (2, True)
    assert runtime.broker.failed_login_delay == 2.5
    assert runtime.broker.failed_login_delay_max == 7.0
    assert runtime.broker.max_connections == 77
    broker = config.broker_settings()
    assert (broker.failed_login_delay, broker.failed_login_delay_max) == (2.5, 7.0)
    assert broker.max_connections == 77
    assert runtime.config_path is None
    assert runtime.override_args == ()
    assert config.to_runtime(tmp_path / "ledge.toml").config_path == str(tmp_path / "ledge.toml")


# ----------------------------------------------------------------------- load_config


def test_load_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ledge.toml"
    path.write_text("[broker]\nmax_connections = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.path == str(path)
    assert str(info.value).startswith(f"{path}: broker.max_connections (line 2): ")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.path == str(path)


def test_load_config_cannot_read(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert info.value.path == str(missing)
    assert info.value.problems == ["cannot read: No such file or directory"]
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"# \xff\n")
    with pytest.raises(ConfigError) as info:
        load_config(binary)
    assert info.value.path == str(binary)
    assert info.value.problems == ["not UTF-8 text (byte 2)"]


def test_load_config_reads_utf8_whatever_the_locale(tmp_path: Path, ascii_locale: None) -> None:
    path = tmp_path / "ledge.toml"
    path.write_text('[gateway]\nid = "café"\n', encoding="utf-8")
    assert load_config(path).to_runtime().gateway.id == "café"


# ----------------------------------------------------------------------- reload marks


def test_an_option_that_declares_no_reload_needs_a_restart() -> None:
    class Plain(BaseModel):
        x: int = 0

    assert reloadable_fields(Plain) == {"x": False}
    assert reloadable_fields(ListenerConfig)["acl_file"] is True
    assert reloadable_fields(ListenerConfig)["port"] is False
