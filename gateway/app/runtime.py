"""The validated configuration as plain data: what the running gateway consumes.

``gateway.app.config`` validates the TOML file with pydantic and produces a
``RuntimeConfig``; the long-running process receives it as JSON and never imports
pydantic, which keeps about 10 MiB of validator out of the gateway's resident
memory. A SIGHUP reload validates in a short-lived child process the same way.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from dataclasses import Field, asdict, dataclass, fields, is_dataclass, replace
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from gateway.broker.auth import (
    ListenerPolicy,
    PasswordAuthenticator,
    PasswordFileError,
    parse_password_file,
)
from gateway.broker.settings import DAY, INT31, MAX_SLOTS, BrokerSettings, option
from gateway.mqttsn.settings import MqttSnSettings
from gateway.net.settings import TLSOptions
from gateway.sensors.settings import (
    BluetoothSettings,
    HomeAssistantSettings,
    ReadingsSettings,
    SensorSettings,
    SerialSettings,
)
from gateway.store.settings import StoreSettings

if TYPE_CHECKING:
    from gateway.bridge.settings import BridgeSettings
    from gateway.broker.acl import Acl
    from gateway.net.http_settings import HTTPSettings
    from gateway.sensors.ble_settings import BleDeviceSettings

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
class ListenerSettings(TLSOptions):
    """One ``[[listeners]]`` table: where clients connect and how (its TLS options,
    for type "tls" and "websocket-tls", are the ones every listener shares)."""

    host: str = option("127.0.0.1")
    port: int = option(1883, ge=0, le=65535)
    name: str = option("")
    type: Literal["tcp", "tls", "websocket", "websocket-tls"] = option("tcp")
    path: str = option("/mqtt", reload=True)
    max_connections: int = option(0, reload=True, ge=0, le=MAX_SLOTS)
    #: None in the file means ``[auth]``'s; the validator fills it in (``resolved``).
    allow_anonymous: bool | None = option(None, reload=True)
    password_file: str | None = option(None, reload=True)
    acl_file: str | None = option(None, reload=True)
    use_identity_as_username: bool = option(False, reload=True)

    def identity(self) -> tuple[str, int, str, str]:
        """What only a restart can change: where it listens and what it speaks."""
        return self.host, self.port, self.name, self.type

    def resolved(self, auth: AuthSettings) -> ListenerSettings:
        """This listener with what it leaves unsaid taken from ``[auth]``."""
        return replace(
            self,
            allow_anonymous=auth.allow_anonymous
            if self.allow_anonymous is None
            else self.allow_anonymous,
            password_file=self.password_file or auth.password_file,
            acl_file=self.acl_file or auth.acl_file,
        )


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """``[auth]``: what listeners that say nothing use (the failed-login delays are
    ``BrokerSettings`` options written in this table)."""

    allow_anonymous: bool = option(True, reload=True)
    password_file: str | None = option(None, reload=True)
    acl_file: str | None = option(None, reload=True)


@dataclass(frozen=True, slots=True)
class LogSettings:
    level: Literal["debug", "info", "warning", "error"] = option("info", reload=True)


def default_gateway_id() -> str:
    """The host name, made safe for a topic level."""
    name = socket.gethostname().split(".")[0] or "ledge"
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    id: str = option(factory=default_gateway_id)
    #: Seconds between <prefix>/<gateway>/health reports; 0: none.
    health_interval: float = option(60.0, ge=0, le=DAY)
    #: The SD-card image's record of the last system update (gateway.app.system_update).
    system_update_file: str = option("/data/update/last")


@dataclass(frozen=True, slots=True)
class HealthSettings:
    """``[health]``: what ``ledge health`` holds the gateway to. The running gateway
    reads none of it (a reload changes nothing in it)."""

    #: Seconds ``ledge health --wait`` (without a number) keeps checking before it
    #: calls the gateway unhealthy.
    timeout: float = option(300.0, reload=True, gt=0, le=DAY)


@dataclass(frozen=True, slots=True)
class TapSettings:
    module: str | None = option(None)
    queue_size: int = option(1000, ge=1, le=INT31)


def _one_listener() -> tuple[ListenerSettings, ...]:
    return (ListenerSettings(),)


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """Everything the gateway process needs, already validated: the config file's
    tables as they are, plus where it came from."""

    listeners: tuple[ListenerSettings, ...] = option(factory=_one_listener, min_length=1)
    data_dir: str | None = option(None)
    broker: BrokerSettings = option(factory=BrokerSettings)
    store: StoreSettings = option(factory=StoreSettings)
    gateway: GatewaySettings = option(factory=GatewaySettings)
    readings: ReadingsSettings = option(factory=ReadingsSettings)
    serial: tuple[SerialSettings, ...] = option(())
    homeassistant: HomeAssistantSettings = option(factory=HomeAssistantSettings)
    taps: TapSettings = option(factory=TapSettings)
    bluetooth: BluetoothSettings = option(factory=BluetoothSettings)
    ble: tuple[BleDeviceSettings, ...] = option(())
    bridges: tuple[BridgeSettings, ...] = option((), reload=True)
    mqttsn: MqttSnSettings = option(factory=MqttSnSettings)
    auth: AuthSettings = option(factory=AuthSettings)
    log: LogSettings = option(factory=LogSettings)
    health: HealthSettings = option(factory=HealthSettings)
    #: None: no ``[http]`` table (no HTTP listener).
    http: HTTPSettings | None = option(None, reload=True)
    #: The file the config came from (None: the embedded default) ...
    config_path: str | None = option(None, internal=True)
    #: ... and the command-line flags that override it, re-applied on reload.
    override_args: tuple[str, ...] = option((), internal=True)

    @property
    def reloadable(self) -> tuple[str, ...]:
        """Broker settings a SIGHUP may change while running."""
        return tuple(f.name for f in fields(BrokerSettings) if f.metadata.get("reload"))

    @property
    def allow_anonymous(self) -> bool:
        return self.auth.allow_anonymous

    @property
    def password_file(self) -> str | None:
        return self.auth.password_file

    @property
    def acl_file(self) -> str | None:
        return self.auth.acl_file

    @property
    def log_level(self) -> str:
        return self.log.level

    @property
    def health_interval(self) -> float:
        return self.gateway.health_interval

    @property
    def sensors(self) -> SensorSettings:
        readings = self.readings
        return SensorSettings(
            gateway=self.gateway.id,
            prefix=readings.topic_prefix,
            plain_payload=readings.payload == "value",
            qos=readings.qos,
            retain=readings.retain,
            serial=self.serial,
            homeassistant=self.homeassistant.enabled,
            discovery_prefix=self.homeassistant.discovery_prefix,
            bluetooth=self.bluetooth,
            ble=self.ble,
            data_dir=self.data_dir,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RuntimeConfig:
        config = from_data(cls, json.loads(text))
        assert isinstance(config, RuntimeConfig)
        return config


#: Settings classes the runtime's annotations name without importing them, by module.
LAZY_SETTINGS: dict[str, str] = {
    "BleDeviceSettings": "gateway.sensors.ble_settings",
    "BridgeSettings": "gateway.bridge.settings",
    "HTTPSettings": "gateway.net.http_settings",
}


def _field_value(kind: type, f: Field[Any], data: Any) -> Any:
    """A field's value from JSON; its type hint is evaluated only when the value is
    a container (plain values need none, and every hint evaluated costs memory)."""
    if not isinstance(data, dict | list):
        return data
    if isinstance(data, list) and not data:
        return ()
    hint = f.type
    if isinstance(hint, str):
        names = dict(vars(sys.modules[kind.__module__]))
        for name, module in LAZY_SETTINGS.items():
            if name in hint:
                # Imported only when its table is in the config: it costs memory otherwise.
                names[name] = getattr(__import__(module, fromlist=[name]), name)
        hint = eval(hint, names)  # our own annotations, from our own module
    return from_data(hint, data)


def from_data(kind: Any, data: Any) -> Any:
    """``data`` (JSON: dicts and lists) as a value of type ``kind``: settings
    dataclasses, tuples, dicts and optional values, rebuilt from their type hints."""
    if data is None:
        return None
    if is_dataclass(kind) and isinstance(kind, type):
        return kind(**{f.name: _field_value(kind, f, data[f.name]) for f in fields(kind)})
    origin = get_origin(kind)
    args = get_args(kind)
    if origin in (Union, UnionType):
        inner = [a for a in args if a is not type(None)]
        return from_data(inner[0], data) if len(inner) == 1 else data
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_data(args[0], item) for item in data)
        return tuple(from_data(a, item) for a, item in zip(args, data, strict=True))
    if origin is dict:
        # JSON object keys are strings; a dict keyed by numbers gets them back.
        key = int if args[0] is int else str
        return {key(k): from_data(args[1], v) for k, v in data.items()}
    return data


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
        except UnicodeDecodeError as exc:
            raise ConfigError(
                str(password_file), [f"auth.password_file: not UTF-8 text (byte {exc.start})"]
            ) from None
        # Lines that cannot be read are skipped (those users cannot log in) and named
        # by ``file_warnings``; the rest of the file serves.
        users = parse_password_file(text)
    return PasswordAuthenticator(allow_anonymous, users)


def build_acl(acl_file: str | Path, key: str = "auth.acl_file") -> Acl:
    """The ACL of a config; reads and checks the file."""
    from gateway.broker.acl import AclFileError, parse_acl_file

    try:
        text = Path(acl_file).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(acl_file), [f"{key}: cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(acl_file), [f"{key}: not UTF-8 text (byte {exc.start})"]) from None
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
        assert listener.allow_anonymous is not None, "a listener not resolved against [auth]"
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
    group or everyone may read (mosquitto warns the same way); and every password file
    line that is skipped because it cannot be read, by file and line number."""
    import stat

    secrets: list[tuple[str, str | None]] = []
    for listener in config.listeners:
        secrets += [
            ("password file", listener.password_file),
            ("ACL file", listener.acl_file),
            ("TLS key", listener.keyfile),
        ]
    http = config.http
    if http is not None and http.enabled:
        secrets += [
            ("password file", http.password_file),
            ("token file", http.token_file),
            ("TLS key", http.keyfile),
        ]
    files: dict[str, str] = {}
    for kind, path in secrets:
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
        if kind == "password file":
            warnings.extend(
                f"password file {path} {problem}: line skipped, that user cannot log in"
                for problem in password_file_problems(path)
            )
    return warnings


def password_file_problems(path: str | Path) -> list[PasswordFileError]:
    """The lines of a password file that are skipped (an unreadable file: none here;
    reading it fails where it is loaded)."""
    skipped: list[PasswordFileError] = []
    try:
        parse_password_file(Path(path).read_text(encoding="utf-8"), skipped)
    except (OSError, UnicodeDecodeError):
        return []
    return skipped
