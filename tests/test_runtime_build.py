"""What the gateway builds from a validated config (``gateway.app.runtime``): the
authenticators, ACLs and per-listener policies, the warnings about secrets others can
read, a listener's defaults from ``[auth]``, the gateway id, and the config's trip
through JSON into the gateway process. In-process, no gateway started."""

from __future__ import annotations

import locale
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app.config import parse_config
from gateway.app.runtime import (
    AuthSettings,
    ConfigError,
    ListenerSettings,
    RuntimeConfig,
    build_acl,
    build_authenticator,
    build_policies,
    default_gateway_id,
    file_warnings,
    from_data,
    listener_label,
    password_file_problems,
)
from gateway.broker.acl import AclFileError, parse_acl_file
from gateway.broker.auth import hash_password
from gateway.mqtt.reason_codes import ReasonCode
from gateway.net.http_settings import HTTPSettings
from gateway.sensors.field_settings import FieldSettings

#: A password file line is slow to check at the default iteration count; one will do.
FAST = 1


def user_line(user: str, password: str) -> str:
    return f"{user}:{hash_password(password, FAST).encode()}\n"


@pytest.fixture
def ascii_locale() -> Iterator[None]:
    """A system whose locale is not UTF-8 (LANG=C on an old image, say): the gateway
    must still read its files as UTF-8."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        assert locale.getencoding() != "UTF-8"
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


# ----------------------------------------------------------------------- ConfigError


def test_a_config_error_names_the_file_on_every_problem() -> None:
    error = ConfigError("/etc/ledge.toml", ["a: bad", "b (line 3): worse"])
    assert str(error) == "/etc/ledge.toml: a: bad\n/etc/ledge.toml: b (line 3): worse"
    assert error.path == "/etc/ledge.toml"
    assert error.problems == ["a: bad", "b (line 3): worse"]


# ----------------------------------------------------------------------- [auth] defaults


def test_a_listener_that_says_nothing_takes_auth_s_choices() -> None:
    auth = AuthSettings(allow_anonymous=False, password_file="/auth/pw", acl_file="/auth/acl")
    resolved = ListenerSettings().resolved(auth)
    assert resolved.allow_anonymous is False
    assert resolved.password_file == "/auth/pw"
    assert resolved.acl_file == "/auth/acl"
    assert resolved.identity() == ListenerSettings().identity()


def test_a_listener_s_own_choices_win_over_auth() -> None:
    auth = AuthSettings(allow_anonymous=False, password_file="/auth/pw", acl_file="/auth/acl")
    own = ListenerSettings(allow_anonymous=True, password_file="/l/pw", acl_file="/l/acl")
    resolved = own.resolved(auth)
    assert (resolved.allow_anonymous, resolved.password_file, resolved.acl_file) == (
        True,
        "/l/pw",
        "/l/acl",
    )
    # ... also where [auth] says nothing: the listener's files are not dropped.
    alone = own.resolved(AuthSettings(allow_anonymous=True))
    assert (alone.allow_anonymous, alone.password_file, alone.acl_file) == (
        True,
        "/l/pw",
        "/l/acl",
    )
    closed = ListenerSettings(allow_anonymous=False).resolved(AuthSettings(allow_anonymous=True))
    assert closed.allow_anonymous is False
    assert (closed.password_file, closed.acl_file) == (None, None)


# ----------------------------------------------------------------------- gateway id


@pytest.mark.parametrize(
    ("hostname", "expected"),
    [
        ("Pi-Kitchen_2.lan", "Pi-Kitchen_2"),
        ("edge box+1.example.com", "edge_box_1"),
        ("", "ledge"),
        (".local", "ledge"),
        ("plain", "plain"),
    ],
)
def test_the_default_gateway_id_is_the_host_name_as_one_topic_level(
    monkeypatch: pytest.MonkeyPatch, hostname: str, expected: str
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    assert default_gateway_id() == expected


# ----------------------------------------------------------------------- authenticator


def test_without_a_password_file_only_the_anonymous_policy_decides() -> None:
    closed = build_authenticator(False, None)
    assert closed.users is None
    assert closed.allow_anonymous is False
    assert closed.check("c", None, None) == ReasonCode.NOT_AUTHORIZED
    assert closed.check("c", "alice", b"pw") == ReasonCode.NOT_AUTHORIZED
    opened = build_authenticator(True, None)
    assert opened.users is None
    assert opened.check("c", None, None) == ReasonCode.SUCCESS


def test_the_password_file_s_users_log_in_with_their_passwords(
    tmp_path: Path, ascii_locale: None
) -> None:
    pw = write(tmp_path / "pw", "# users\n" + user_line("alice", "a-pw") + user_line("josé", "é"))
    auth = build_authenticator(False, pw)
    assert auth.users is not None and sorted(auth.users) == ["alice", "josé"]
    assert auth.allow_anonymous is False
    assert auth.authenticate("c", "alice", b"a-pw") == ReasonCode.SUCCESS
    assert auth.authenticate("c", "alice", b"wrong") == ReasonCode.BAD_USER_NAME_OR_PASSWORD
    assert auth.authenticate("c", "josé", "é".encode()) == ReasonCode.SUCCESS
    assert auth.authenticate("c", None, None) == ReasonCode.NOT_AUTHORIZED
    # A str path reads the same file.
    same = build_authenticator(True, str(pw))
    assert same.users is not None and sorted(same.users) == ["alice", "josé"]
    assert same.authenticate("c", None, None) == ReasonCode.SUCCESS


def test_an_unreadable_password_file_is_a_config_error_naming_the_option(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError) as info:
        build_authenticator(True, missing)
    assert info.value.path == str(missing)
    assert info.value.problems == ["auth.password_file: cannot read: No such file or directory"]
    with pytest.raises(ConfigError) as info:
        build_authenticator(True, tmp_path)
    assert info.value.problems == ["auth.password_file: cannot read: Is a directory"]


def test_a_password_file_that_is_not_utf8_is_a_config_error_not_a_crash(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    good = user_line("alice", "x").encode()
    pw.write_bytes(good + b"b\xffb:x\n")
    with pytest.raises(ConfigError) as info:
        build_authenticator(True, pw)
    assert info.value.path == str(pw)
    assert info.value.problems == [f"auth.password_file: not UTF-8 text (byte {len(good) + 1})"]


# ----------------------------------------------------------------------- ACL


def test_an_acl_file_is_read_as_utf8_into_rules(tmp_path: Path, ascii_locale: None) -> None:
    acl_path = write(tmp_path / "acl", "user alice\ntopic read café/#\ntopic write out/alice\n")
    acl = build_acl(acl_path)
    rules = acl.rules_for("alice", "c1")
    assert rules.can_read("café/x")
    assert not rules.can_write("café/x")
    assert rules.can_write("out/alice")
    assert not acl.rules_for("bob", "c2").can_read("café/x")
    assert build_acl(str(acl_path)).rules_for("alice", "c").can_read("café/x")


def test_an_unreadable_acl_file_names_the_option_it_came_from(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ConfigError) as info:
        build_acl(missing)
    assert info.value.path == str(missing)
    assert info.value.problems == ["auth.acl_file: cannot read: No such file or directory"]
    with pytest.raises(ConfigError) as info:
        build_acl(missing, "listeners[3].acl_file")
    assert info.value.problems == ["listeners[3].acl_file: cannot read: No such file or directory"]
    binary = tmp_path / "bin"
    binary.write_bytes(b"topic a\n\xfe")
    with pytest.raises(ConfigError) as info:
        build_acl(binary, "listeners[1].acl_file")
    assert info.value.path == str(binary)
    assert info.value.problems == ["listeners[1].acl_file: not UTF-8 text (byte 8)"]


def test_a_bad_acl_line_is_a_config_error_with_its_line(tmp_path: Path) -> None:
    text = "user alice\ntopic red a/b\n"
    with pytest.raises(AclFileError) as parsed:
        parse_acl_file(text)
    acl_path = write(tmp_path / "acl", text)
    with pytest.raises(ConfigError) as info:
        build_acl(acl_path, "listeners[0].acl_file")
    assert info.value.path == str(acl_path)
    assert info.value.problems == [f"listeners[0].acl_file: {parsed.value}"]
    assert "line 2: unknown access 'red'" in info.value.problems[0]


# ----------------------------------------------------------------------- policies


def test_each_listener_gets_its_own_policy_by_label(tmp_path: Path) -> None:
    pw = write(tmp_path / "pw", user_line("alice", "a-pw"))
    acl = write(tmp_path / "acl", "user alice\ntopic read a/#\n")
    listeners = (
        ListenerSettings(port=1, allow_anonymous=True),
        ListenerSettings(
            port=2,
            name="secure",
            allow_anonymous=False,
            password_file=str(pw),
            acl_file=str(acl),
            max_connections=5,
            use_identity_as_username=True,
        ),
        ListenerSettings(port=3, allow_anonymous=False, password_file=str(pw), acl_file=str(acl)),
        ListenerSettings(port=4, allow_anonymous=True, password_file=str(pw)),
    )
    policies = build_policies(listeners)
    assert list(policies) == ["listener 0", "secure", "listener 2", "listener 3"]
    open_, secure, third, fourth = policies.values()

    assert open_.acl is None
    assert open_.max_connections == 0
    assert open_.use_identity_as_username is False
    assert open_.authenticator.check("c", None, None) == ReasonCode.SUCCESS

    assert secure.max_connections == 5
    assert secure.use_identity_as_username is True
    assert secure.authenticator.check("c", None, None) == ReasonCode.NOT_AUTHORIZED
    assert secure.acl is not None
    assert secure.acl.rules_for("alice", "c").can_read("a/b")
    assert not secure.acl.rules_for("alice", "c").can_write("a/b")
    assert secure.authenticator.authenticate("c", "alice", b"a-pw") == ReasonCode.SUCCESS  # type: ignore[attr-defined]

    # The same files with the same anonymous policy: read once, shared.
    assert third.authenticator is secure.authenticator
    assert third.acl is secure.acl
    assert third.max_connections == 0
    # The same file, another anonymous policy: an authenticator of its own.
    assert fourth.authenticator is not secure.authenticator
    assert fourth.authenticator.check("c", None, None) == ReasonCode.SUCCESS
    assert fourth.acl is None


def test_a_listener_s_unreadable_acl_is_named_by_its_index(tmp_path: Path) -> None:
    acl = write(tmp_path / "acl", "topic a\n")
    missing = tmp_path / "gone"
    listeners = (
        ListenerSettings(port=1, allow_anonymous=True, acl_file=str(acl)),
        ListenerSettings(port=2, allow_anonymous=True, acl_file=str(acl)),
        ListenerSettings(port=3, allow_anonymous=True, acl_file=str(missing)),
    )
    with pytest.raises(ConfigError) as info:
        build_policies(listeners)
    assert info.value.path == str(missing)
    assert info.value.problems == ["listeners[2].acl_file: cannot read: No such file or directory"]


def test_a_listener_not_resolved_against_auth_is_refused() -> None:
    with pytest.raises(AssertionError, match=r"^a listener not resolved against \[auth\]$"):
        build_policies((ListenerSettings(),))


def test_listener_labels() -> None:
    assert listener_label(ListenerSettings(name="ws"), 3) == "ws"
    assert listener_label(ListenerSettings(), 3) == "listener 3"


# ----------------------------------------------------------------------- file warnings


def _warning(kind: str, path: Path, mode: int) -> str:
    return f"{kind} {path} can be read by its group or others (mode {mode:04o}): chmod 600 it"


def test_secrets_others_can_read_are_warned_about_by_kind(tmp_path: Path) -> None:
    missing = tmp_path / "missing-key"  # cannot be looked at: no warning, the rest go on
    pw = write(tmp_path / "pw", user_line("alice", "x"), 0o640)
    acl = write(tmp_path / "acl", "topic a\n", 0o604)
    key = write(tmp_path / "key", "KEY", 0o610)
    private = write(tmp_path / "private-key", "KEY", 0o600)
    http_pw = write(tmp_path / "http-pw", user_line("bob", "y"), 0o660)
    token = write(tmp_path / "token", "t" * 32, 0o602)
    http_key = write(tmp_path / "http-key", "KEY", 0o644)
    config = RuntimeConfig(
        listeners=(
            ListenerSettings(keyfile=str(missing)),
            ListenerSettings(password_file=str(pw), acl_file=str(acl), keyfile=str(key)),
            ListenerSettings(password_file=str(pw), keyfile=str(private)),
        ),
        http=HTTPSettings(
            enabled=True,
            password_file=str(http_pw),
            token_file=str(token),
            keyfile=str(http_key),
        ),
    )
    assert file_warnings(config) == [
        _warning("password file", pw, 0o640),
        _warning("ACL file", acl, 0o604),
        _warning("TLS key", key, 0o610),
        _warning("password file", http_pw, 0o660),
        _warning("token file", token, 0o602),
        _warning("TLS key", http_key, 0o644),
    ]


def test_a_disabled_http_listener_s_files_are_not_looked_at(tmp_path: Path) -> None:
    http_pw = write(tmp_path / "http-pw", "bad line\n", 0o644)
    config = RuntimeConfig(http=HTTPSettings(enabled=False, password_file=str(http_pw)))
    assert file_warnings(config) == []
    assert file_warnings(RuntimeConfig()) == []


def test_a_file_named_twice_is_warned_about_once_as_what_it_first_was(tmp_path: Path) -> None:
    shared = write(tmp_path / "shared", "", 0o644)
    config = RuntimeConfig(
        listeners=(ListenerSettings(acl_file=str(shared), password_file=str(shared)),),
        http=HTTPSettings(enabled=True, token_file=str(shared)),
    )
    assert file_warnings(config) == [_warning("password file", shared, 0o644)]


def test_skipped_password_file_lines_are_warned_about_with_their_line(tmp_path: Path) -> None:
    pw = write(tmp_path / "pw", user_line("alice", "x") + "bob:$9$nope\nno-colon\n")
    acl = write(tmp_path / "acl", "no-colon\n")  # not a password file: not read as one
    http_pw = write(tmp_path / "http-pw", "carol:\n")
    config = RuntimeConfig(
        listeners=(ListenerSettings(password_file=str(pw), acl_file=str(acl)),),
        http=HTTPSettings(enabled=True, password_file=str(http_pw)),
    )
    tail = ": line skipped, that user cannot log in"
    assert file_warnings(config) == [
        f"password file {pw} line 2: user 'bob': unknown hash format (expected $7$... or "
        f"$6$...){tail}",
        f"password file {pw} line 3: expected user:hash{tail}",
        f"password file {http_pw} line 1: user 'carol': unknown hash format (expected $7$... "
        f"or $6$...){tail}",
    ]


def test_password_file_problems(tmp_path: Path, ascii_locale: None) -> None:
    pw = write(tmp_path / "pw", user_line("josé", "x") + "\n# c\nrené\n")
    problems = password_file_problems(pw)
    assert [(p.line, str(p)) for p in problems] == [(4, "line 4: expected user:hash")]
    assert [str(p) for p in password_file_problems(str(pw))] == ["line 4: expected user:hash"]
    assert password_file_problems(write(tmp_path / "good", user_line("a", "b"))) == []
    # Unreadable: nothing here (loading it is what fails, and says so).
    assert password_file_problems(tmp_path / "missing") == []
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff:x\nbad\n")
    assert password_file_problems(binary) == []


# ----------------------------------------------------------------------- JSON trip


FULL = """
data_dir = "/var/lib/ledge"
[[listeners]]
port = 1
name = "plain"
[[listeners]]
port = 2
type = "websocket"
path = "/ws"
[[serial]]
name = "meter"
path = "/dev/ttyUSB0"
[serial.fields.t]
quantity = "temperature"
unit = "°C"
scale = 0.1
[[ble]]
name = "tag"
address = "a4:c1:38:12:34:56"
format = "bthome"
[http]
enabled = true
port = 9999
[mqttsn]
predefined_topics = { 1 = "a/b", 7 = "c/d" }
[[bridges]]
name = "cloud"
address = "cloud.example:1884"
addresses = ["[::1]"]
[[bridges.rules]]
filter = "a/#"
"""


def test_the_runtime_config_reaches_the_gateway_process_as_it_was() -> None:
    runtime_config = parse_config(FULL).to_runtime()
    back = RuntimeConfig.from_json(runtime_config.to_json())
    assert back == runtime_config
    assert [(lc.port, lc.name, lc.type) for lc in back.listeners] == [
        (1, "plain", "tcp"),
        (2, "", "websocket"),
    ]
    assert back.serial[0].fields == {"t": FieldSettings("temperature", "°C", 0.1, 0.0)}
    assert back.ble[0].address == "A4:C1:38:12:34:56"
    assert back.http is not None and back.http.port == 9999
    assert back.mqttsn.predefined_topics == {1: "a/b", 7: "c/d"}
    assert back.bridges[0].addresses == (("cloud.example", 1884), ("::1", 1883))
    assert back.bridges[0].rules[0].filter == "a/#"
    assert back.data_dir == "/var/lib/ledge"
    # Without the optional tables: none appear.
    bare = RuntimeConfig.from_json(RuntimeConfig().to_json())
    assert bare == RuntimeConfig()
    assert bare.http is None and bare.bridges == () and bare.serial == ()


def test_from_data_rebuilds_values_from_their_type_hints() -> None:
    assert from_data(int | None, None) is None
    assert from_data(int | None, 5) == 5
    assert from_data(str | int, "x") == "x"
    # A union of more than one type is kept as JSON gave it (not forced into the first).
    assert from_data(tuple[int, ...] | str, "abc") == "abc"
    assert from_data(FieldSettings | int, 5) == 5
    assert from_data(
        FieldSettings | None, {"quantity": "q", "unit": None, "scale": 2.0, "offset": 1.0}
    ) == (FieldSettings("q", None, 2.0, 1.0))
    assert from_data(tuple[int, ...], [1, 2, 3]) == (1, 2, 3)
    assert from_data(tuple[str, int], ["h", 1]) == ("h", 1)
    assert from_data(
        tuple[FieldSettings, int], [{"quantity": "q", "unit": "u", "scale": 1.0, "offset": 0.0}, 3]
    ) == (
        FieldSettings("q", "u"),
        3,
    )
    with pytest.raises(ValueError):
        from_data(tuple[str, int], ["h", 1, 2])  # not silently cut short
    assert from_data(dict[int, str], {"1": "a", "20": "b"}) == {1: "a", 20: "b"}
    assert from_data(
        dict[str, FieldSettings],
        {"7": {"quantity": "q", "unit": None, "scale": 1.0, "offset": 0.0}},
    ) == {"7": FieldSettings("q")}
    assert from_data(str, "as is") == "as is"
