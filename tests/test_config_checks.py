"""What validating the config file checks beyond bounds -- files read as the gateway
will read them, TLS material loaded, names that are topic levels, GATT UUIDs -- and
that every problem names its key path and the line that set it. In-process."""

from __future__ import annotations

import locale
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.app.config import key_path, parse_config
from gateway.app.runtime import ConfigError
from gateway.broker.acl import AclFileError, parse_acl_file
from tests.support.certs import Certs


@pytest.fixture
def ascii_locale() -> Iterator[None]:
    """A system whose locale is not UTF-8: files are still read as UTF-8."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.toml")
    assert str(info.value).startswith("t.toml: ")
    return info.value.problems


# ----------------------------------------------------------------------- files


def test_password_and_acl_files_are_checked_where_they_are_configured(
    tmp_path: Path, ascii_locale: None
) -> None:
    pw = tmp_path / "pw"
    pw.write_text("josé:$7$1$c2FsdA==$aGFzaA==\n", encoding="utf-8")
    acl = tmp_path / "acl"
    acl.write_text("user josé\ntopic read café/#\n", encoding="utf-8")
    config = parse_config(
        f"[[listeners]]\npassword_file = '{pw}'\nacl_file = '{acl}'\n"
        f"[auth]\npassword_file = '{pw}'\nacl_file = '{acl}'\n"
        f"[http]\npassword_file = '{pw}'\n"
    )
    runtime = config.to_runtime()
    assert (runtime.listeners[0].password_file, runtime.listeners[0].acl_file) == (
        str(pw),
        str(acl),
    )
    assert runtime.http is not None and runtime.http.password_file == str(pw)


def test_a_password_file_that_is_not_utf8_is_named_by_key_and_line(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_bytes(b"alice:x\n\xff\n")
    reason = f"Value error, {str(pw)!r}: 'utf-8' codec can't decode byte 0xff in position 8"
    assert problems(f"[[listeners]]\nport = 1\npassword_file = '{pw}'\n") == [
        f"listeners[0].password_file (line 3): {reason}: invalid start byte"
    ]
    assert problems(f"[http]\npassword_file = '{pw}'\n") == [
        f"http.password_file (line 2): {reason}: invalid start byte"
    ]
    # [auth]'s too: it is the same file format (it used to pass here and then stop
    # check-config with a traceback).
    assert problems(f"[auth]\n\npassword_file = '{pw}'\n") == [
        f"auth.password_file (line 3): {reason}: invalid start byte"
    ]


def test_a_bad_acl_file_is_named_by_key_and_line(tmp_path: Path) -> None:
    text = "user alice\ntopic red a/b\n"
    with pytest.raises(AclFileError) as parsed:
        parse_acl_file(text)
    acl = tmp_path / "acl"
    acl.write_text(text)
    reason = f"Value error, {str(acl)!r}: {parsed.value}"
    assert problems(f"[[listeners]]\nport = 1\n\nacl_file = '{acl}'\n") == [
        f"listeners[0].acl_file (line 4): {reason}"
    ]
    assert problems(f"[auth]\nacl_file = '{acl}'\n") == [f"auth.acl_file (line 2): {reason}"]


def test_a_file_that_cannot_be_read_says_why(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert problems(f"[[listeners]]\nacl_file = '{missing}'\n") == [
        f"listeners[0].acl_file (line 2): Value error, cannot read {str(missing)!r}: "
        "No such file or directory"
    ]
    assert problems(f"[auth]\npassword_file = '{tmp_path}'\n") == [
        f"auth.password_file (line 2): Value error, cannot read {str(tmp_path)!r}: Is a directory"
    ]


# ----------------------------------------------------------------------- TLS


def test_a_tls_listener_with_good_material_is_accepted(certs: Certs) -> None:
    runtime = parse_config(
        f"[[listeners]]\ntype = 'tls'\nport = 8883\ncertfile = '{certs.server_cert}'\n"
        f"keyfile = '{certs.server_key}'\ncafile = '{certs.ca}'\nrequire_certificate = true\n"
        f"[http]\ncertfile = '{certs.server_cert}'\nkeyfile = '{certs.server_key}'\n"
    ).to_runtime()
    listener = runtime.listeners[0]
    assert (listener.certfile, listener.keyfile, listener.cafile) == (
        str(certs.server_cert),
        str(certs.server_key),
        str(certs.ca),
    )
    assert listener.require_certificate is True
    assert runtime.http is not None and runtime.http.keyfile == str(certs.server_key)


def test_client_certificates_need_the_ca_that_signs_them(certs: Certs) -> None:
    tls = f"certfile = '{certs.server_cert}'\nkeyfile = '{certs.server_key}'\n"
    assert problems(f"[[listeners]]\ntype = 'tls'\n{tls}require_certificate = true\n") == [
        "listeners[0] (line 1): Value error, require_certificate needs cafile "
        "(the CA that signs clients)"
    ]
    assert problems(f"[http]\n{tls}require_certificate = true\n") == [
        "http (line 1): Value error, require_certificate needs cafile (the CA that signs clients)"
    ]


def test_a_key_that_does_not_match_its_certificate_is_found_when_validating(
    certs: Certs,
) -> None:
    found = problems(
        f"[[listeners]]\ntype = 'tls'\ncertfile = '{certs.server_cert}'\n"
        f"keyfile = '{certs.client_key}'\n"
    )
    assert len(found) == 1
    assert found[0].startswith(
        "listeners[0] (line 1): Value error, cannot use certfile/keyfile/cafile: "
    )
    assert "KEY_VALUES_MISMATCH" in found[0] or "key values mismatch" in found[0]
    # HTTPS loads its material the same way.
    found = problems(f"[http]\ncertfile = '{certs.server_cert}'\nkeyfile = '{certs.client_key}'\n")
    assert found[0].startswith("http (line 1): Value error, cannot use certfile/keyfile/cafile: ")


# ----------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["a/b", "a+", "#", "$sys", "a b", "nul\\u0000"])
def test_serial_and_bridge_names_are_topic_levels(name: str) -> None:
    reason = "Value error, must not contain '/', '+', '#', '$' or spaces (it is a topic level)"
    assert problems(f'[[serial]]\nname = "{name}"\npath = "/dev/x"\n') == [
        f"serial[0].name (line 2): {reason}"
    ]
    bridge = f'[[bridges]]\nname = "{name}"\naddress = "h"\n[[bridges.rules]]\nfilter = "a"\n'
    assert problems(bridge) == [f"bridges[0].name (line 2): {reason}"]


def test_a_name_with_any_letter_is_a_topic_level() -> None:
    runtime = parse_config(
        '[[serial]]\nname = "XBee-2_é"\npath = "/dev/x"\n'
        '[[bridges]]\nname = "X"\naddress = "h"\n[[bridges.rules]]\nfilter = "a"\n'
    ).to_runtime()
    assert runtime.serial[0].name == "XBee-2_é"
    assert runtime.bridges[0].name == "X"


# ----------------------------------------------------------------------- GATT UUIDs

GATT = """
[[ble]]
name = "t"
address = "A4:C1:38:12:34:56"
format = "gatt"
{command}
[[ble.characteristics]]
uuid = "{uuid}"
[[ble.characteristics.fields]]
quantity = "q"
"""


@pytest.mark.parametrize(
    ("uuid", "expected"),
    [
        ("2A19", "00002a19-0000-1000-8000-00805f9b34fb"),
        ("2a19", "00002a19-0000-1000-8000-00805f9b34fb"),
        ("0x2A6E", "00002a6e-0000-1000-8000-00805f9b34fb"),
        ("EBE0CCC1-7A0A-4B0C-8A1A-6FF2997DA3A6", "ebe0ccc1-7a0a-4b0c-8a1a-6ff2997da3a6"),
        ("ebe0ccc1-7a0a-4b0c-8a1a-6ff2997da3a6", "ebe0ccc1-7a0a-4b0c-8a1a-6ff2997da3a6"),
    ],
)
def test_gatt_uuids_are_written_in_full_lower_case(uuid: str, expected: str) -> None:
    runtime = parse_config(GATT.format(uuid=uuid, command="")).to_runtime()
    device = runtime.ble[0]
    assert device.characteristics[0].uuid == expected
    assert device.command_uuid is None
    with_command = parse_config(
        GATT.format(uuid="2a19", command=f'command_uuid = "{uuid}"')
    ).to_runtime()
    assert with_command.ble[0].command_uuid == expected


@pytest.mark.parametrize(
    "uuid", ["xyz", "2a1", "2a199", "0x2a1g", "ebe0ccc1-7a0a-4b0c-8a1a-6ff2997da3a"]
)
def test_a_gatt_uuid_that_is_none_is_named(uuid: str) -> None:
    assert problems(GATT.format(uuid=uuid, command="")) == [
        f"ble[0].characteristics[0].uuid (line 8): Value error, {uuid!r} is not a UUID "
        "(xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx or 2a19)"
    ]


# ----------------------------------------------------------------------- key paths, lines

NESTED = """\
data_dir = "/d"
[[bridges]]
name = "a"
address = "h"
[[bridges.rules]]
filter = "x/#"
[[bridges]]
name = "b"
address = "h"
[[bridges.rules]]
filter = "y/#"
[[bridges.rules]]
filter = "z/#"
qos = 5
"""


def test_a_problem_in_a_nested_array_of_tables_names_its_own_line() -> None:
    assert problems(NESTED) == [
        "bridges[1].rules[1].qos (line 14): Input should be less than or equal to 2"
    ]
    wrong_first = NESTED.replace('filter = "x/#"', 'filter = "x/#"\nqos = 9')
    assert problems(wrong_first) == [
        "bridges[0].rules[0].qos (line 7): Input should be less than or equal to 2",
        "bridges[1].rules[1].qos (line 15): Input should be less than or equal to 2",
    ]


def test_a_top_level_key_before_any_table_has_its_line() -> None:
    assert problems('\n\ndata_dir = 5\n[log]\nlevel = "info"\n') == [
        "data_dir (line 3): Input should be a valid string"
    ]


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ('[serial.fields."temp"]\nquantity = ""\n', "serial[0].fields.temp.quantity (line 5)"),
        ("[serial.fields.'temp']\nquantity = ''\n", "serial[0].fields.temp.quantity (line 5)"),
        ('[serial.fields.Temp]\nquantity = ""\n', "serial[0].fields.Temp.quantity (line 5)"),
        ('[serial.fields.Xtal]\nquantity = ""\n', "serial[0].fields.Xtal.quantity (line 5)"),
        ('fields."t x".quantity = ""\n', "serial[0].fields.t x.quantity (line 4)"),
        ("fields.t.quantity = ''\n", "serial[0].fields.t.quantity (line 4)"),
    ],
)
def test_quoted_and_dotted_keys_are_found_on_their_line(table: str, expected: str) -> None:
    text = '[[serial]]\nname = "m"\npath = "/dev/x"\n' + table
    assert problems(text) == [f"{expected}: String should have at least 1 character"]


def test_a_key_the_line_finder_cannot_read_is_named_without_a_line() -> None:
    assert problems('"a\\"b" = 1\n') == ['a"b: unknown option']


def test_key_paths() -> None:
    assert key_path(("listeners", 1, "port")) == "listeners[1].port"
    assert key_path(("bridges", 0, "rules", 2)) == "bridges[0].rules[2]"
    assert key_path(("log",)) == "log"
    assert key_path(()) == "(top level)"


def test_text_from_no_file_is_named_config() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config("[log]\nlevel = 'loud'\n")
    assert info.value.path == "<config>"
    assert str(info.value).startswith("<config>: log.level (line 2): ")
    with pytest.raises(ConfigError) as info:
        parse_config("[log\n")
    assert str(info.value).startswith("<config>: TOML syntax error: ")
