"""The validated configuration as plain data: what the running gateway consumes.

``gateway.config`` validates the TOML file with pydantic and produces a
``RuntimeConfig``; the long-running process receives it as JSON and never imports
pydantic, which keeps about 10 MiB of validator out of the gateway's resident
memory. A SIGHUP reload validates in a short-lived child process the same way.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.bridge.settings import BridgeSettings, OutboxSettings, RuleSettings, TlsSettings
from gateway.broker.auth import (
    ListenerPolicy,
    PasswordAuthenticator,
    PasswordFileError,
    parse_password_file,
)
from gateway.broker.settings import BrokerSettings
from gateway.mqttsn.settings import MqttSnSettings, UdpSettings
from gateway.mqttsn.settings import SerialSettings as MqttSnSerial
from gateway.store.settings import StoreSettings

if TYPE_CHECKING:
    from gateway.broker.acl import Acl

#: Environment variable carrying the validated config into the gateway process.
RUNTIME_ENV = "LEDGE_RUNTIME_CONFIG"


class ConfigError(Exception):
    """A config that cannot be used; ``str()`` names the file, key path and line."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__("\n".join(f"{path}: {p}" for p in problems))
        self.path = path
        self.problems = problems


class StartupError(Exception):
    """The gateway cannot start (an unusable store, say); the message says why and how on."""


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    name: str = ""
    type: str = "tcp"
    path: str = "/mqtt"
    max_connections: int = 0
    #: Resolved: the listener's own value, else ``[auth]``'s.
    allow_anonymous: bool = True
    password_file: str | None = None
    acl_file: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    cafile: str | None = None
    require_certificate: bool = False
    use_identity_as_username: bool = False
    tls_version: str = "tlsv1.2"

    def identity(self) -> tuple[str, int, str, str]:
        """What only a restart can change: where it listens and what it speaks."""
        return self.host, self.port, self.name, self.type


@dataclass(frozen=True, slots=True)
class FieldSettings:
    quantity: str
    unit: str | None = None
    scale: float = 1.0
    offset: float = 0.0


@dataclass(frozen=True, slots=True)
class SerialSettings:
    name: str
    path: str
    protocol: str = "jsonl"
    baudrate: int = 9600
    bytesize: int = 8
    parity: str = "none"
    stopbits: float = 1
    max_line: int = 1024
    fields: dict[str, FieldSettings] = field(default_factory=dict)
    only_mapped: bool = False
    commands: bool = False
    command_newline: str = "\n"


@dataclass(frozen=True, slots=True)
class SensorSettings:
    gateway: str
    prefix: str = "ledge"
    plain_payload: bool = False
    qos: int = 0
    retain: bool = False
    serial: tuple[SerialSettings, ...] = ()
    homeassistant: bool = False
    discovery_prefix: str = "homeassistant"


@dataclass(frozen=True, slots=True)
class TapSettings:
    module: str | None = None
    queue_size: int = 1000


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Everything the gateway process needs, already validated."""

    listeners: tuple[ListenerSettings, ...]
    broker: BrokerSettings
    allow_anonymous: bool = True
    password_file: str | None = None
    acl_file: str | None = None
    log_level: str = "info"
    data_dir: str | None = None
    store: StoreSettings = field(default_factory=StoreSettings)
    sensors: SensorSettings = field(default_factory=lambda: SensorSettings("ledge"))
    taps: TapSettings = field(default_factory=TapSettings)
    bridges: tuple[BridgeSettings, ...] = ()
    mqttsn: MqttSnSettings = field(default_factory=MqttSnSettings)
    #: Seconds between <prefix>/<gateway>/health reports; 0: none.
    health_interval: float = 60.0
    #: The file the config came from (None: the embedded default) ...
    config_path: str | None = None
    #: ... and the command-line flags that override it, re-applied on reload.
    override_args: tuple[str, ...] = ()
    #: Broker settings a SIGHUP may change while running.
    reloadable: tuple[str, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RuntimeConfig:
        data: dict[str, Any] = json.loads(text)
        broker = dict(data["broker"])
        broker["deny_subscriptions"] = tuple(broker["deny_subscriptions"])
        known = {f.name for f in fields(BrokerSettings)}
        return cls(
            listeners=tuple(ListenerSettings(**lc) for lc in data["listeners"]),
            broker=BrokerSettings(**{k: v for k, v in broker.items() if k in known}),
            allow_anonymous=data["allow_anonymous"],
            password_file=data["password_file"],
            acl_file=data["acl_file"],
            log_level=data["log_level"],
            data_dir=data["data_dir"],
            store=StoreSettings(**data["store"]),
            sensors=_sensor_settings(data["sensors"]),
            taps=TapSettings(**data["taps"]),
            bridges=tuple(_bridge_settings(b) for b in data["bridges"]),
            mqttsn=_mqttsn_settings(data["mqttsn"]),
            health_interval=data["health_interval"],
            config_path=data["config_path"],
            override_args=tuple(data["override_args"]),
            reloadable=tuple(data["reloadable"]),
        )


def _sensor_settings(data: dict[str, Any]) -> SensorSettings:
    serial = tuple(
        SerialSettings(
            **{
                **s,
                "fields": {k: FieldSettings(**f) for k, f in s["fields"].items()},
            }
        )
        for s in data["serial"]
    )
    return SensorSettings(**{**data, "serial": serial})


def _bridge_settings(data: dict[str, Any]) -> BridgeSettings:
    return BridgeSettings(
        **{
            **data,
            "addresses": tuple((host, port) for host, port in data["addresses"]),
            "rules": tuple(RuleSettings(**r) for r in data["rules"]),
            "tls": TlsSettings(**data["tls"]),
            "outbox": OutboxSettings(**data["outbox"]),
        }
    )


def _mqttsn_settings(data: dict[str, Any]) -> MqttSnSettings:
    return MqttSnSettings(
        **{
            **data,
            "udp": tuple(
                UdpSettings(
                    **{
                        **u,
                        "broadcast": tuple(u["broadcast"]),
                        "allow_client_ids": tuple(u["allow_client_ids"]),
                    }
                )
                for u in data["udp"]
            ),
            "serial": tuple(
                MqttSnSerial(**{**s, "allow_client_ids": tuple(s["allow_client_ids"])})
                for s in data["serial"]
            ),
            # JSON object keys are strings; topic ids are numbers.
            "predefined_topics": {int(k): v for k, v in data["predefined_topics"].items()},
        }
    )


def build_authenticator(
    allow_anonymous: bool, password_file: str | Path | None
) -> PasswordAuthenticator:
    """The authenticator for a config; reads and checks the password file."""
    users = None
    if password_file is not None:
        try:
            text = Path(password_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                str(password_file), [f"auth.password_file: cannot read: {exc.strerror or exc}"]
            ) from None
        try:
            users = parse_password_file(text)
        except PasswordFileError as exc:
            raise ConfigError(str(password_file), [f"auth.password_file: {exc}"]) from None
    return PasswordAuthenticator(allow_anonymous, users)


def build_acl(acl_file: str | Path, key: str = "auth.acl_file") -> Acl:
    """The ACL of a config; reads and checks the file."""
    from gateway.broker.acl import AclFileError, parse_acl_file

    try:
        text = Path(acl_file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(acl_file), [f"{key}: cannot read: {exc.strerror or exc}"]) from None
    try:
        return parse_acl_file(text)
    except AclFileError as exc:
        raise ConfigError(str(acl_file), [f"{key}: {exc}"]) from None


def build_policies(listeners: tuple[ListenerSettings, ...]) -> dict[str, ListenerPolicy]:
    """Each listener's authentication, ACL and connection limit, by label (files read
    once per distinct path)."""
    authenticators: dict[tuple[bool, str | None], PasswordAuthenticator] = {}
    acls: dict[str, Acl] = {}
    policies: dict[str, ListenerPolicy] = {}
    for i, listener in enumerate(listeners):
        auth_key = (listener.allow_anonymous, listener.password_file)
        authenticator = authenticators.get(auth_key)
        if authenticator is None:
            authenticator = authenticators[auth_key] = build_authenticator(*auth_key)
        acl = None
        if listener.acl_file is not None:
            acl = acls.get(listener.acl_file)
            if acl is None:
                acl = acls[listener.acl_file] = build_acl(
                    listener.acl_file, f"listeners[{i}].acl_file"
                )
        policies[listener_label(listener, i)] = ListenerPolicy(
            authenticator, acl, listener.max_connections, listener.use_identity_as_username
        )
    return policies


def listener_label(listener: ListenerSettings, index: int) -> str:
    """How logs (and the core's per-listener policies) name a listener."""
    return listener.name or f"listener {index}"


def file_warnings(config: RuntimeConfig) -> list[str]:
    """Secrets readable by others: password files, ACL files and TLS keys that the
    group or everyone may read (mosquitto warns the same way)."""
    import stat

    files: dict[str, str] = {}
    for listener in config.listeners:
        for kind, path in (
            ("password file", listener.password_file),
            ("ACL file", listener.acl_file),
            ("TLS key", listener.keyfile),
        ):
            if path is not None:
                files.setdefault(path, kind)
    warnings = []
    for path, kind in files.items():
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            warnings.append(
                f"{kind} {path} can be read by its group or others (mode "
                f"{stat.S_IMODE(mode):04o}): chmod 600 it"
            )
    return warnings
