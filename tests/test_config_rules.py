"""Every rule the config's checks hold -- between options (a TLS type needs its files,
a beacon identity only for beacon formats, names unique) and within one (a topic id in
range, a UUID, a topic level) -- refuses a config that breaks it, naming the key path
and the rule.

The checks are found on the config models themselves (pydantic's validators), and every
``raise ValueError`` in each must be reached by a case here (its message's fixed text is
in what a case is refused for), so a rule added later without a case fails
``test_every_rule_of_every_check_is_broken_by_a_case``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest

from gateway.app import config as C
from gateway.app.config import parse_config
from gateway.app.runtime import ConfigError
from tests.support.certs import Certs, make_certs

DEVICE = '[[ble]]\nname = "b"\n'
ADDRESS = 'address = "A4:C1:38:12:34:56"\n'
BRIDGE = '[[bridges]]\nname = "up"\naddress = "127.0.0.1:1883"\n'
RULE = '[[bridges.rules]]\nfilter = "a/#"\n'
SERIAL = 'path = "/dev/null"\nprotocol = "kv"\n'


@dataclass(frozen=True)
class Case:
    #: (config model, validator) the case is for.
    check: tuple[str, str]
    #: The config; ``{d}`` is a directory with the files below, ``{certs}`` the test CA's.
    toml: str
    #: The key path the error names ...
    where: str
    #: ... and a fragment of what it says.
    says: str


#: Files the cases refer to, written into ``{d}``.
FILES: dict[str, str | bytes] = {
    "passwd": "user:not-a-hash\n",
    "acl": "topic bogus a/b\n",
    "bad-utf8": b"\xff\xfe",
    "short-token": "0123456789\n",
    "ca.pem": "not a certificate\n",
}

CASES = [
    # [[listeners]]: TLS types and their files, the path, the files' contents.
    Case(
        ("ListenerConfig", "_consistent"),
        '[[listeners]]\ntype = "tls"\ncertfile = "{certs}/ledge-server.crt"\n',
        "listeners[0]",
        "type 'tls' needs certfile and keyfile",
    ),
    Case(
        ("ListenerConfig", "_consistent"),
        '[[listeners]]\ncafile = "{certs}/ledge-test-ca.crt"\n',
        "listeners[0]",
        "cafile only apply to type 'tls' or 'websocket-tls'",
    ),
    Case(
        ("ListenerConfig", "_consistent"),
        "[[listeners]]\nuse_identity_as_username = true\n",
        "listeners[0]",
        "use_identity_as_username only apply to",
    ),
    Case(
        ("ListenerConfig", "_consistent"),
        '[[listeners]]\ntype = "tls"\n'
        'certfile = "{certs}/ledge-server.crt"\nkeyfile = "{certs}/ledge-server.key"\n'
        "use_identity_as_username = true\n",
        "listeners[0]",
        "use_identity_as_username needs require_certificate = true",
    ),
    Case(
        ("ListenerConfig", "_consistent"),
        '[[listeners]]\ntype = "websocket"\npath = "mqtt"\n',
        "listeners[0]",
        "path 'mqtt' must start with '/'",
    ),
    Case(
        ("ListenerConfig", "_consistent"),
        '[[listeners]]\ntype = "tls"\n'
        'certfile = "{certs}/ledge-server.crt"\nkeyfile = "{certs}/ledge-server.key"\n'
        "require_certificate = true\n",
        "listeners[0]",
        "require_certificate needs cafile",
    ),
    Case(
        ("ListenerConfig", "_consistent"),
        '[[listeners]]\ntype = "tls"\n'
        'certfile = "{certs}/ledge-server.crt"\nkeyfile = "{certs}/sensor-1.key"\n',
        "listeners[0]",
        "cannot use certfile/keyfile/cafile",
    ),
    Case(
        ("ListenerConfig", "_files"),
        '[[listeners]]\ntype = "tls"\n'
        'certfile = "{d}/missing.crt"\nkeyfile = "{certs}/ledge-server.key"\n',
        "listeners[0].certfile",
        "cannot read",
    ),
    Case(
        ("ListenerConfig", "_passwords"),
        '[[listeners]]\npassword_file = "{d}/bad-utf8"\n',
        "listeners[0].password_file",
        "codec can't decode byte 0xff",
    ),
    Case(
        ("ListenerConfig", "_acl"),
        '[[listeners]]\nacl_file = "{d}/acl"\n',
        "listeners[0].acl_file",
        "line 1: unknown access 'bogus'",
    ),
    # [auth]
    Case(
        ("AuthConfig", "_delays"),
        "[auth]\nfailed_login_delay = 5\nfailed_login_delay_max = 4\n",
        "auth",
        "failed_login_delay_max is below failed_login_delay",
    ),
    Case(
        ("AuthConfig", "_passwords"),
        '[auth]\npassword_file = "{d}/missing"\n',
        "auth.password_file",
        "cannot read",
    ),
    Case(
        ("AuthConfig", "_acl"),
        '[auth]\nacl_file = "{d}/acl"\n',
        "auth.acl_file",
        "line 1: unknown access 'bogus'",
    ),
    # [broker], [gateway]
    Case(
        ("BrokerConfig", "_filters_valid"),
        '[broker]\ndeny_subscriptions = ["a/#/b"]\n',
        "broker.deny_subscriptions",
        "entry 0 ('a/#/b')",
    ),
    Case(
        ("GatewayConfig", "_topic_level"),
        '[gateway]\nid = "gw/1"\n',
        "gateway.id",
        "must be non-empty without '/'",
    ),
    # [http]
    Case(
        ("HTTPConfig", "_tls"),
        '[http]\ncertfile = "{certs}/ledge-server.crt"\n',
        "http",
        "certfile and keyfile go together (HTTPS)",
    ),
    Case(
        ("HTTPConfig", "_tls"),
        '[http]\ncafile = "{certs}/ledge-test-ca.crt"\n',
        "http",
        "cafile and require_certificate need certfile and keyfile",
    ),
    Case(
        ("HTTPConfig", "_tls"),
        '[http]\ncertfile = "{certs}/ledge-server.crt"\n'
        'keyfile = "{certs}/ledge-server.key"\nrequire_certificate = true\n',
        "http",
        "require_certificate needs cafile",
    ),
    Case(
        ("HTTPConfig", "_tls"),
        '[http]\ncertfile = "{certs}/ledge-server.crt"\n'
        'keyfile = "{certs}/ledge-server.key"\ncafile = "{d}/ca.pem"\n',
        "http",
        "cannot use certfile/keyfile/cafile",
    ),
    Case(
        ("HTTPConfig", "_files"),
        '[http]\ncertfile = "{d}/missing.crt"\nkeyfile = "{certs}/ledge-server.key"\n',
        "http.certfile",
        "cannot read",
    ),
    Case(
        ("HTTPConfig", "_passwords"),
        '[http]\npassword_file = "{d}/missing"\n',
        "http.password_file",
        "cannot read",
    ),
    Case(
        ("HTTPConfig", "_token"),
        '[http]\ntoken_file = "{d}/short-token"\n',
        "http.token_file",
        "shorter than 16 characters",
    ),
    # [[serial]]
    Case(
        ("SerialConfig", "_name"),
        '[[serial]]\nname = "a b"\n' + SERIAL,
        "serial[0].name",
        "must not contain '/', '+', '#', '$' or spaces",
    ),
    Case(
        ("SerialConfig", "_stopbits"),
        '[[serial]]\nname = "s"\n' + SERIAL + "stopbits = 3\n",
        "serial[0].stopbits",
        "must be 1, 1.5 or 2",
    ),
    # [bluetooth] and [[ble]]
    Case(
        ("BluetoothConfig", "_patterns"),
        '[bluetooth]\nallow = ["A4:C1:38:*", "phone"]\n',
        "bluetooth.allow",
        "entry 1 ('phone') is not an address pattern",
    ),
    Case(
        ("BluetoothConfig", "_backoff"),
        "[bluetooth]\nreconnect_min = 9\nreconnect_max = 8\n",
        "bluetooth",
        "reconnect_max must not be below reconnect_min",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE,
        "ble[0]",
        "give the device's address, or (for a beacon) its beacon identity",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE + ADDRESS + 'beacon = "ibeacon:e2c56db5-dffb-48d2-b060-d0f5a71096e0:1:2"\n',
        "ble[0]",
        "give the device's address, or",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE + 'format = "bthome"\nbeacon = "ibeacon:e2c56db5-dffb-48d2-b060-d0f5a71096e0:1:2"\n',
        "ble[0]",
        "beacon applies to formats 'ibeacon' and 'eddystone'",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE + ADDRESS + 'format = "atc1441"\nbindkey = "231d39c1d7cc1ab1aee224cd096db932"\n',
        "ble[0]",
        "bindkey applies to formats 'bthome' and 'mibeacon'",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE + ADDRESS + 'format = "gatt"\n',
        "ble[0]",
        "format 'gatt' needs characteristics or a command_uuid",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE + ADDRESS + 'format = "bthome"\n'
        '[[ble.characteristics]]\nuuid = "2a19"\n'
        '[[ble.characteristics.fields]]\nquantity = "battery"\n',
        "ble[0]",
        "characteristics apply to formats 'gatt' and 'lywsd03mmc'",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE + ADDRESS + 'format = "bthome"\ncommand_uuid = "2a19"\n',
        "ble[0]",
        "command_uuid applies to formats 'gatt' and 'lywsd03mmc'",
    ),
    Case(
        ("BleDeviceConfig", "_consistent"),
        DEVICE + 'format = "lywsd03mmc"\n'
        'beacon = "ibeacon:e2c56db5-dffb-48d2-b060-d0f5a71096e0:1:2"\n',
        "ble[0]",
        "a GATT device needs its address",
    ),
    Case(
        ("BleDeviceConfig", "_topic_level"),
        '[[ble]]\nname = "adapter"\n' + ADDRESS,
        "ble[0].name",
        "nor be 'adapter'",
    ),
    Case(
        ("BleDeviceConfig", "_address"),
        DEVICE + 'address = "A4:C1:38:12:34"\n',
        "ble[0].address",
        "is not a Bluetooth address",
    ),
    Case(
        ("BleDeviceConfig", "_bindkey"),
        DEVICE + ADDRESS + 'bindkey = "00112233"\n',
        "ble[0].bindkey",
        "a bindkey is 32 hex digits, got 8",
    ),
    Case(
        ("BleDeviceConfig", "_command_uuid"),
        DEVICE + ADDRESS + 'format = "gatt"\ncommand_uuid = "2a1"\n',
        "ble[0].command_uuid",
        "is not a UUID",
    ),
    Case(
        ("GattCharacteristicConfig", "_uuid"),
        DEVICE + ADDRESS + 'format = "gatt"\n'
        '[[ble.characteristics]]\nuuid = "battery"\n'
        '[[ble.characteristics.fields]]\nquantity = "battery"\n',
        "ble[0].characteristics[0].uuid",
        "'battery' is not a UUID",
    ),
    # [[bridges]]
    Case(
        ("BridgeConfig", "_remote"),
        '[[bridges]]\nname = "up"\n' + RULE,
        "bridges[0]",
        "give the remote broker as address",
    ),
    Case(
        ("BridgeConfig", "_remote"),
        BRIDGE + "reconnect_min = 9\nreconnect_max = 8\n" + RULE,
        "bridges[0]",
        "reconnect_max must not be below reconnect_min",
    ),
    Case(
        ("BridgeConfig", "_remote"),
        '[[bridges]]\nname = "up"\naddresses = ["h:0"]\n' + RULE,
        "bridges[0]",
        "address 'h:0': port '0' is not 1..65535",
    ),
    Case(
        ("BridgeConfig", "_name"),
        '[[bridges]]\nname = "up/1"\naddress = "h"\n' + RULE,
        "bridges[0].name",
        "must not contain '/'",
    ),
    Case(
        ("TlsConfig", "_files"),
        BRIDGE + RULE + '[bridges.tls]\nenabled = true\ncert_file = "{certs}/sensor-1.crt"\n',
        "bridges[0].tls",
        "cert_file and key_file go together (mutual TLS)",
    ),
    Case(
        ("TlsConfig", "_files"),
        BRIDGE + RULE + '[bridges.tls]\nenabled = true\nca_file = "{d}/missing.crt"\n',
        "bridges[0].tls",
        "ca_file: no such file",
    ),
    Case(
        ("RuleConfig", "_valid"),
        BRIDGE + '[[bridges.rules]]\nfilter = "$share/g/a"\n',
        "bridges[0].rules[0]",
        "shared subscriptions cannot be bridged",
    ),
    # [mqttsn]
    Case(
        ("MqttSnConfig", "_predefined"),
        '[mqttsn.predefined_topics]\n65535 = "a/b"\n',
        "mqttsn.predefined_topics",
        "topic id 65535 is not 1..65534",
    ),
    Case(
        ("MqttSnConfig", "_predefined"),
        '[mqttsn.predefined_topics]\n7 = "a/+"\n',
        "mqttsn.predefined_topics",
        "topic id 7 ('a/+')",
    ),
    Case(
        ("MqttSnConfig", "_names"),
        "[[mqttsn.udp]]\nport = 1884\n[[mqttsn.udp]]\nport = 1884\n",
        "mqttsn",
        "two MQTT-SN transports are named 'udp 127.0.0.1:1884'",
    ),
    Case(
        ("MqttSnUdpConfig", "_addresses"),
        '[[mqttsn.udp]]\nbroadcast = ["h:70000"]\n',
        "mqttsn.udp[0].broadcast",
        "port '70000' is not 1..65535",
    ),
    # names unique across a kind of table
    Case(
        ("ConfigFile", "_unique_names"),
        '[[serial]]\nname = "s"\n' + SERIAL + '[[serial]]\nname = "s"\n' + SERIAL,
        "serial",
        "two serial devices are named 's'",
    ),
    Case(
        ("ConfigFile", "_unique_names"),
        DEVICE + ADDRESS + DEVICE + ADDRESS,
        "ble",
        "two BLE devices are named 'b'",
    ),
    Case(
        ("ConfigFile", "_unique_names"),
        BRIDGE + RULE + BRIDGE + RULE,
        "bridges",
        "two bridges are named 'up'",
    ),
]


def _checks() -> dict[tuple[str, str], Any]:
    """(config model, validator) -> the validator's function, for every section model."""
    found: dict[tuple[str, str], Any] = {}
    for value in vars(C).values():
        if (
            isinstance(value, type)
            and issubclass(value, pydantic.BaseModel)
            and not value.__name__.startswith("_")
            and value.__module__ == C.__name__
            and value is not C.Config  # (the file's model, ConfigFile, with a docstring)
        ):
            decorators = value.__pydantic_decorators__
            for kind in (decorators.model_validators, decorators.field_validators):
                for name, decorator in kind.items():
                    func = decorator.func
                    found[(value.__name__, name)] = getattr(func, "__func__", func)
    return found


def _rules(func: Any) -> list[str]:
    """The ``raise ValueError(...)`` statements in the function's own body, each as the
    longest piece of fixed text in its message."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    out = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Raise)
            and isinstance(node.exc, ast.Call)
            and getattr(node.exc.func, "id", None) == "ValueError"
        ):
            continue
        message = node.exc.args[0]
        parts = message.values if isinstance(message, ast.JoinedStr) else [message]
        texts = [p.value for p in parts if isinstance(p, ast.Constant) and isinstance(p.value, str)]
        out.append(max(texts, key=len, default=""))  # ("": any refusal)
    return out


def _problems(case: Case, files: tuple[Path, Certs]) -> list[str]:
    """What the config of ``case`` is refused for."""
    directory, certs = files
    text = case.toml.replace("{d}", str(directory)).replace("{certs}", str(certs.directory))
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    return refused.value.problems


def test_every_rule_of_every_check_is_broken_by_a_case(files: tuple[Path, Certs]) -> None:
    checks = _checks()
    assert len(checks) >= 30, sorted(checks)  # (the walk found the models)
    assert not {c.check for c in CASES} - set(checks), "cases for checks that no longer exist"
    said: dict[tuple[str, str], list[str]] = {check: [] for check in checks}
    for case in CASES:
        said[case.check] += _problems(case, files)
    missing = {
        check: [rule for rule in _rules(func) if not any(rule in p for p in said[check])]
        or (["(a case)"] if not said[check] else [])
        for check, func in checks.items()
    }
    missing = {check: rules for check, rules in missing.items() if rules}
    assert not missing, f"rules no case here breaks: {missing}"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Certs]:
    directory = tmp_path_factory.mktemp("rules")
    for name, content in FILES.items():
        path = directory / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return directory, make_certs(directory / "certs")


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c.check[0]}.{c.check[1]}-{i}" for i, c in enumerate(CASES)]
)
def test_a_config_that_breaks_the_rule_is_refused_naming_key_and_rule(
    case: Case, files: tuple[Path, Certs]
) -> None:
    problems = _problems(case, files)
    ours = [p for p in problems if p.split(" ")[0].rstrip(":") == case.where]
    assert ours, f"no problem at {case.where}: {problems}"
    assert any(case.says in p for p in ours), (case.says, ours)
