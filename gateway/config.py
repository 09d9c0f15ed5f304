"""The one config file: TOML, validated by pydantic, errors naming key path and line.

Every option has a default, so an empty file (or none) is the embedded default
config: one listener on 127.0.0.1:1883, anonymous clients allowed. Options marked
``reload=True`` are applied on SIGHUP; the rest need a restart.
"""

from __future__ import annotations

import importlib
import re
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from gateway.bridge.rules import rule_errors
from gateway.bridge.settings import BridgeSettings, OutboxSettings, RuleSettings, TlsSettings
from gateway.broker.settings import NEVER_EXPIRES, BrokerSettings
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.topics import filter_error
from gateway.mqtt.wire import VARINT_MAX
from gateway.runtime import (
    ConfigError,
    FieldSettings,
    ListenerSettings,
    RuntimeConfig,
    SensorSettings,
    SerialSettings,
    TapSettings,
)
from gateway.store.settings import StoreSettings


def _reload(yes: bool) -> dict[str, Any]:
    return {"reload": yes}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _readable(path: Path | None) -> Path | None:
    """A file that must be readable now (checked where the config is validated)."""
    if path is not None:
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise ValueError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return path


def _parsed(path: Path | None, module: str, parser: str) -> Path | None:
    """A readable file that ``module.parser`` accepts; the module is imported only when a
    file is configured (it costs memory otherwise)."""
    if _readable(path) is None:
        return path
    assert path is not None
    parse = getattr(importlib.import_module(module), parser)
    try:
        parse(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{str(path)!r}: {exc}") from None
    return path


def _password_file(path: Path | None) -> Path | None:
    return _parsed(path, "gateway.broker.auth", "parse_password_file")


def _acl_file(path: Path | None) -> Path | None:
    return _parsed(path, "gateway.broker.acl", "parse_acl_file")


class ListenerConfig(_Model):
    """One place clients connect (mosquitto's ``listener`` with per-listener settings)."""

    host: str = Field("127.0.0.1", description="Address to bind.", json_schema_extra=_reload(False))
    port: int = Field(
        1883,
        ge=0,
        le=65535,
        description="TCP port; 0 picks a free one.",
        json_schema_extra=_reload(False),
    )
    name: str = Field("", description="Label used in logs.", json_schema_extra=_reload(False))
    type: Literal["tcp", "tls", "websocket", "websocket-tls"] = Field(
        "tcp", json_schema_extra=_reload(False)
    )
    path: str = Field("/mqtt", json_schema_extra=_reload(True))
    max_connections: int = Field(0, ge=0, json_schema_extra=_reload(True))
    allow_anonymous: bool | None = Field(None, json_schema_extra=_reload(True))
    password_file: Path | None = Field(None, json_schema_extra=_reload(True))
    acl_file: Path | None = Field(None, json_schema_extra=_reload(True))
    certfile: Path | None = Field(None, json_schema_extra=_reload(True))
    keyfile: Path | None = Field(None, json_schema_extra=_reload(True))
    cafile: Path | None = Field(None, json_schema_extra=_reload(True))
    require_certificate: bool = Field(False, json_schema_extra=_reload(True))
    use_identity_as_username: bool = Field(False, json_schema_extra=_reload(True))
    tls_version: Literal["tlsv1.2", "tlsv1.3"] = Field("tlsv1.2", json_schema_extra=_reload(True))

    _files = field_validator("certfile", "keyfile", "cafile")(_readable)
    _passwords = field_validator("password_file")(_password_file)
    _acl = field_validator("acl_file")(_acl_file)

    @model_validator(mode="after")
    def _consistent(self) -> ListenerConfig:
        tls = self.type in ("tls", "websocket-tls")
        if tls and (self.certfile is None or self.keyfile is None):
            raise ValueError(f"type {self.type!r} needs certfile and keyfile")
        if not tls:
            options = ("certfile", "keyfile", "cafile", "require_certificate")
            given = [o for o in options if getattr(self, o)]
            if given or self.use_identity_as_username:
                raise ValueError(
                    f"{', '.join(given or ['use_identity_as_username'])} only apply to "
                    "type 'tls' or 'websocket-tls'"
                )
        if self.require_certificate and self.cafile is None:
            raise ValueError("require_certificate needs cafile (the CA that signs clients)")
        if self.use_identity_as_username and not self.require_certificate:
            raise ValueError("use_identity_as_username needs require_certificate = true")
        if not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r} must start with '/'")
        if tls:
            self._load_tls()
        return self

    def _load_tls(self) -> None:
        """Load the certificate, key and CA as the gateway will (a key that does not
        match its certificate is found here, not at start-up)."""
        import ssl

        from gateway.net.tls import TLSSettings, server_context

        assert self.certfile is not None and self.keyfile is not None
        try:
            server_context(
                TLSSettings(
                    str(self.certfile),
                    str(self.keyfile),
                    None if self.cafile is None else str(self.cafile),
                    self.require_certificate,
                    self.tls_version,
                )
            )
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ValueError(f"cannot use certfile/keyfile/cafile: {exc}") from None


class BrokerConfig(_Model):
    """Broker limits and switches (see the example config for each meaning)."""

    max_connections: int = Field(1024, ge=1, json_schema_extra=_reload(False))
    max_packet_size: int = Field(
        1_048_576, ge=64, le=VARINT_MAX + 5, json_schema_extra=_reload(False)
    )
    max_keepalive: int = Field(60, ge=0, le=65535, json_schema_extra=_reload(True))
    connect_timeout: float = Field(10.0, gt=0, json_schema_extra=_reload(True))
    receive_maximum: int = Field(100, ge=1, le=65535, json_schema_extra=_reload(False))
    max_inflight: int = Field(100, ge=1, le=65535, json_schema_extra=_reload(True))
    max_queued_messages: int = Field(1000, ge=0, json_schema_extra=_reload(True))
    max_queued_bytes: int = Field(8 * 1024 * 1024, ge=0, json_schema_extra=_reload(True))
    queue_qos0_offline: bool = Field(False, json_schema_extra=_reload(True))
    topic_alias_maximum: int = Field(10, ge=0, le=65535, json_schema_extra=_reload(False))
    retain_available: bool = Field(True, json_schema_extra=_reload(False))
    max_retained_messages: int = Field(10_000, ge=0, json_schema_extra=_reload(False))
    max_retained_bytes: int = Field(64 * 1024 * 1024, ge=0, json_schema_extra=_reload(False))
    wildcard_subscriptions: bool = Field(True, json_schema_extra=_reload(False))
    shared_subscriptions: bool = Field(True, json_schema_extra=_reload(False))
    subscription_identifiers: bool = Field(True, json_schema_extra=_reload(False))
    max_subscriptions_per_client: int = Field(4096, ge=1, json_schema_extra=_reload(True))
    max_session_expiry_interval: int = Field(
        NEVER_EXPIRES, ge=0, le=NEVER_EXPIRES, json_schema_extra=_reload(True)
    )
    persistent_session_expiry: int = Field(
        NEVER_EXPIRES, ge=0, le=NEVER_EXPIRES, json_schema_extra=_reload(True)
    )
    allow_zero_length_client_id: bool = Field(True, json_schema_extra=_reload(True))
    assigned_client_id_prefix: str = Field("ledge-", json_schema_extra=_reload(True))
    deny_subscriptions: list[str] = Field(default_factory=list, json_schema_extra=_reload(True))
    deny_subscription_reason: Literal["unspecified_error", "not_authorized"] = Field(
        "unspecified_error", json_schema_extra=_reload(True)
    )
    sys_interval: float = Field(10.0, ge=0, json_schema_extra=_reload(False))
    response_information_prefix: str = Field("response/", json_schema_extra=_reload(True))
    max_outbound_bytes: int = Field(1024 * 1024, ge=1024, json_schema_extra=_reload(False))
    slow_consumer_timeout: float = Field(60.0, ge=0, json_schema_extra=_reload(True))

    @field_validator("deny_subscriptions")
    @classmethod
    def _filters_valid(cls, value: list[str]) -> list[str]:
        for i, topic_filter in enumerate(value):
            error = filter_error(topic_filter)
            if error:
                raise ValueError(f"entry {i} ({topic_filter!r}): {error}")
        return value


def default_gateway_id() -> str:
    """The host name, made safe for a topic level."""
    name = socket.gethostname().split(".")[0] or "ledge"
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


class GatewayConfig(_Model):
    id: str = Field(default_factory=default_gateway_id, json_schema_extra=_reload(False))
    health_interval: float = Field(60.0, ge=0, json_schema_extra=_reload(False))

    @field_validator("id")
    @classmethod
    def _topic_level(cls, value: str) -> str:
        if not value or set(value) & set("/+#$ \x00"):
            raise ValueError("must be non-empty without '/', '+', '#', '$' or spaces")
        return value


class ReadingsConfig(_Model):
    topic_prefix: str = Field("ledge", min_length=1, json_schema_extra=_reload(False))
    payload: Literal["json", "value"] = Field("json", json_schema_extra=_reload(False))
    qos: int = Field(0, ge=0, le=2, json_schema_extra=_reload(False))
    retain: bool = Field(False, json_schema_extra=_reload(False))


class FieldConfig(_Model):
    quantity: str = Field(min_length=1)
    unit: str | None = None
    scale: float = 1.0
    offset: float = 0.0


class SerialConfig(_Model):
    name: str = Field(min_length=1, json_schema_extra=_reload(False))
    path: str = Field(min_length=1, json_schema_extra=_reload(False))
    protocol: Literal["nmea", "jsonl", "kv"] = Field("jsonl", json_schema_extra=_reload(False))
    baudrate: int = Field(9600, gt=0, json_schema_extra=_reload(False))
    bytesize: Literal[5, 6, 7, 8] = Field(8, json_schema_extra=_reload(False))
    parity: Literal["none", "even", "odd", "mark", "space"] = Field(
        "none", json_schema_extra=_reload(False)
    )
    stopbits: float = Field(1, json_schema_extra=_reload(False))
    max_line: int = Field(1024, ge=16, le=1_048_576, json_schema_extra=_reload(False))
    fields: dict[str, FieldConfig] = Field(default_factory=dict, json_schema_extra=_reload(False))
    only_mapped: bool = Field(False, json_schema_extra=_reload(False))
    commands: bool = Field(False, json_schema_extra=_reload(False))
    command_newline: str = Field("\n", json_schema_extra=_reload(False))

    @field_validator("name")
    @classmethod
    def _topic_level(cls, value: str) -> str:
        if set(value) & set("/+#$ \x00"):
            raise ValueError("must not contain '/', '+', '#', '$' or spaces (it is a topic level)")
        return value

    @field_validator("stopbits")
    @classmethod
    def _stopbits(cls, value: float) -> float:
        if value not in (1, 1.5, 2):
            raise ValueError("must be 1, 1.5 or 2")
        return value


class HomeAssistantConfig(_Model):
    enabled: bool = Field(False, json_schema_extra=_reload(False))
    discovery_prefix: str = Field("homeassistant", min_length=1, json_schema_extra=_reload(False))


class TapsConfig(_Model):
    module: str | None = Field(None, json_schema_extra=_reload(False))
    queue_size: int = Field(1000, ge=1, json_schema_extra=_reload(False))


class StoreConfig(_Model):
    durability: Literal["power", "process"] = Field("power", json_schema_extra=_reload(False))
    on_corrupt: Literal["refuse", "move-aside"] = Field("refuse", json_schema_extra=_reload(False))
    max_bytes: int = Field(0, ge=0, json_schema_extra=_reload(False))


class BridgeTlsConfig(_Model):
    enabled: bool = False
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure: bool = False

    @model_validator(mode="after")
    def _files(self) -> BridgeTlsConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS)")
        for name in ("ca_file", "cert_file", "key_file"):
            path: Path | None = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file: {path}")
        return self


class BridgeRuleConfig(_Model):
    filter: str = Field(min_length=1)
    direction: Literal["out", "in", "both"] = "out"
    qos: int = Field(1, ge=0, le=2)
    local_prefix: str = ""
    remote_prefix: str = ""
    retain: Literal["keep", "strip"] = "keep"

    @model_validator(mode="after")
    def _valid(self) -> BridgeRuleConfig:
        problems = rule_errors(RuleSettings(**self.model_dump()))
        if problems:
            raise ValueError("; ".join(problems))
        return self


class OutboxConfig(_Model):
    max_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    max_messages: int = Field(500_000, ge=1)
    when_full: Literal["drop-oldest", "drop-newest", "refuse"] = "drop-oldest"
    memory_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024)


class BridgeConfig(_Model):
    name: str = Field(min_length=1, json_schema_extra=_reload(False))
    address: str | None = Field(None, json_schema_extra=_reload(False))
    addresses: list[str] = Field(default_factory=list, json_schema_extra=_reload(False))
    protocol: Literal["5.0", "3.1.1"] = Field("5.0", json_schema_extra=_reload(False))
    client_id: str = Field("", max_length=65535, json_schema_extra=_reload(False))
    username: str | None = Field(None, json_schema_extra=_reload(False))
    password: str | None = Field(None, json_schema_extra=_reload(False))
    keepalive: int = Field(60, ge=0, le=65535, json_schema_extra=_reload(False))
    clean_start: bool = Field(False, json_schema_extra=_reload(False))
    session_expiry: int = Field(3600, ge=0, le=NEVER_EXPIRES, json_schema_extra=_reload(False))
    tls: BridgeTlsConfig = Field(default_factory=BridgeTlsConfig)
    rules: list[BridgeRuleConfig] = Field(min_length=1, json_schema_extra=_reload(False))
    outbox: OutboxConfig = Field(default_factory=OutboxConfig)
    qos0: Literal["outbox", "bypass"] = Field("outbox", json_schema_extra=_reload(False))
    max_inflight: int = Field(100, ge=1, le=65535, json_schema_extra=_reload(False))
    rate_limit: float = Field(0.0, ge=0, json_schema_extra=_reload(False))
    envelope: bool = Field(False, json_schema_extra=_reload(False))
    reconnect_min: float = Field(1.0, gt=0, json_schema_extra=_reload(False))
    reconnect_max: float = Field(60.0, gt=0, json_schema_extra=_reload(False))
    connect_timeout: float = Field(10.0, gt=0, json_schema_extra=_reload(False))

    @field_validator("name")
    @classmethod
    def _topic_level(cls, value: str) -> str:
        if set(value) & set("/+#$ \x00"):
            raise ValueError("must not contain '/', '+', '#', '$' or spaces (it is a topic level)")
        return value

    @model_validator(mode="after")
    def _remote(self) -> BridgeConfig:
        if not self.address and not self.addresses:
            raise ValueError("give the remote broker as address (or addresses, tried in turn)")
        for text in self.remote_addresses():
            parse_remote(text, self.tls.enabled)
        if self.reconnect_max < self.reconnect_min:
            raise ValueError("reconnect_max must not be below reconnect_min")
        return self

    def remote_addresses(self) -> list[str]:
        return ([self.address] if self.address else []) + list(self.addresses)

    def to_settings(self) -> BridgeSettings:
        return BridgeSettings(
            name=self.name,
            addresses=tuple(parse_remote(a, self.tls.enabled) for a in self.remote_addresses()),
            rules=tuple(RuleSettings(**r.model_dump()) for r in self.rules),
            protocol=5 if self.protocol == "5.0" else 4,
            client_id=self.client_id,
            username=self.username,
            password=self.password,
            tls=TlsSettings(
                self.tls.enabled,
                None if self.tls.ca_file is None else str(self.tls.ca_file),
                None if self.tls.cert_file is None else str(self.tls.cert_file),
                None if self.tls.key_file is None else str(self.tls.key_file),
                self.tls.insecure,
            ),
            keepalive=self.keepalive,
            clean_start=self.clean_start,
            session_expiry=self.session_expiry,
            outbox=OutboxSettings(**self.outbox.model_dump()),
            qos0=self.qos0,
            max_inflight=self.max_inflight,
            rate_limit=self.rate_limit,
            envelope=self.envelope,
            reconnect_min=self.reconnect_min,
            reconnect_max=self.reconnect_max,
            connect_timeout=self.connect_timeout,
        )


def parse_remote(text: str, tls: bool) -> tuple[str, int]:
    """``host[:port]`` (port 1883, or 8883 with TLS)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or "]" in port_text:
        host, port_text = text, ""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"address {text!r} has no host")
    if not port_text:
        return host, 8883 if tls else 1883
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ValueError(f"address {text!r}: port {port_text!r} is not 1..65535")
    return host, int(port_text)


class AuthConfig(_Model):
    """Defaults for listeners that say nothing, and the failed-login slowdown."""

    allow_anonymous: bool = Field(True, json_schema_extra=_reload(True))
    password_file: Path | None = Field(None, json_schema_extra=_reload(True))
    acl_file: Path | None = Field(None, json_schema_extra=_reload(True))
    failed_login_delay: float = Field(1.0, ge=0, json_schema_extra=_reload(True))
    failed_login_delay_max: float = Field(30.0, ge=0, json_schema_extra=_reload(True))

    _acl = field_validator("acl_file")(_acl_file)

    @model_validator(mode="after")
    def _delays(self) -> AuthConfig:
        if self.failed_login_delay_max < self.failed_login_delay:
            raise ValueError("failed_login_delay_max is below failed_login_delay")
        return self


class LogConfig(_Model):
    level: Literal["debug", "info", "warning", "error"] = Field(
        "info", json_schema_extra=_reload(True)
    )


class Config(_Model):
    listeners: list[ListenerConfig] = Field(
        default_factory=lambda: [ListenerConfig()], min_length=1, json_schema_extra=_reload(False)
    )
    data_dir: Path | None = Field(None, json_schema_extra=_reload(False))
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    readings: ReadingsConfig = Field(default_factory=ReadingsConfig)
    serial: list[SerialConfig] = Field(default_factory=list, json_schema_extra=_reload(False))
    homeassistant: HomeAssistantConfig = Field(default_factory=HomeAssistantConfig)
    taps: TapsConfig = Field(default_factory=TapsConfig)
    bridges: list[BridgeConfig] = Field(default_factory=list, json_schema_extra=_reload(False))

    @field_validator("serial")
    @classmethod
    def _unique_names(cls, value: list[SerialConfig]) -> list[SerialConfig]:
        names = [s.name for s in value]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two serial devices are named {name!r}")
        return value

    @field_validator("bridges")
    @classmethod
    def _unique_bridges(cls, value: list[BridgeConfig]) -> list[BridgeConfig]:
        names = [b.name for b in value]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two bridges are named {name!r}")
        return value

    auth: AuthConfig = Field(default_factory=AuthConfig)
    log: LogConfig = Field(default_factory=LogConfig)

    def to_runtime(
        self, path: Path | None = None, overrides: Overrides | None = None
    ) -> RuntimeConfig:
        """The validated config as plain data for the gateway process."""
        return RuntimeConfig(
            listeners=tuple(self.listener_settings(lc) for lc in self.listeners),
            broker=self.broker_settings(),
            allow_anonymous=self.auth.allow_anonymous,
            password_file=None if self.auth.password_file is None else str(self.auth.password_file),
            acl_file=None if self.auth.acl_file is None else str(self.auth.acl_file),
            log_level=self.log.level,
            data_dir=None if self.data_dir is None else str(self.data_dir),
            store=StoreSettings(self.store.durability, self.store.on_corrupt, self.store.max_bytes),
            sensors=SensorSettings(
                gateway=self.gateway.id,
                prefix=self.readings.topic_prefix,
                plain_payload=self.readings.payload == "value",
                qos=self.readings.qos,
                retain=self.readings.retain,
                serial=tuple(
                    SerialSettings(
                        **{
                            **s.model_dump(),
                            "fields": {
                                k: FieldSettings(**f.model_dump()) for k, f in s.fields.items()
                            },
                        }
                    )
                    for s in self.serial
                ),
                homeassistant=self.homeassistant.enabled,
                discovery_prefix=self.homeassistant.discovery_prefix,
            ),
            taps=TapSettings(self.taps.module, self.taps.queue_size),
            bridges=tuple(b.to_settings() for b in self.bridges),
            health_interval=self.gateway.health_interval,
            config_path=None if path is None else str(path),
            override_args=overrides.args() if overrides is not None else (),
            reloadable=(
                *(name for name, yes in reloadable_fields(BrokerConfig).items() if yes),
                "failed_login_delay",
                "failed_login_delay_max",
            ),
        )

    def listener_settings(self, lc: ListenerConfig) -> ListenerSettings:
        """A listener as plain data, what it leaves unsaid taken from ``[auth]``."""

        def text(path: Path | None) -> str | None:
            return None if path is None else str(path)

        auth = self.auth
        return ListenerSettings(
            lc.host,
            lc.port,
            lc.name,
            type=lc.type,
            path=lc.path,
            max_connections=lc.max_connections,
            allow_anonymous=auth.allow_anonymous
            if lc.allow_anonymous is None
            else lc.allow_anonymous,
            password_file=text(lc.password_file or auth.password_file),
            acl_file=text(lc.acl_file or auth.acl_file),
            certfile=text(lc.certfile),
            keyfile=text(lc.keyfile),
            cafile=text(lc.cafile),
            require_certificate=lc.require_certificate,
            use_identity_as_username=lc.use_identity_as_username,
            tls_version=lc.tls_version,
        )

    def broker_settings(self) -> BrokerSettings:
        b = self.broker
        values = b.model_dump()
        values["deny_subscriptions"] = tuple(b.deny_subscriptions)
        values["deny_subscription_reason"] = (
            ReasonCode.NOT_AUTHORIZED
            if b.deny_subscription_reason == "not_authorized"
            else ReasonCode.UNSPECIFIED_ERROR
        )
        values["failed_login_delay"] = self.auth.failed_login_delay
        values["failed_login_delay_max"] = self.auth.failed_login_delay_max
        return BrokerSettings(**values)


# ----------------------------------------------------------------------- loading


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [f"not UTF-8 text (byte {exc.start})"]) from None
    return parse_config(text, str(path))


def parse_config(text: str, source: str = "<config>") -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, [f"TOML syntax error: {exc}"]) from None
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = _KeyLines(text)
        problems = []
        for error in exc.errors():
            loc = tuple(error["loc"])
            where = key_path(loc)
            line = lines.find(loc)
            message = error["msg"]
            if error["type"] == "extra_forbidden":
                message = "unknown option"
            at = f" (line {line})" if line else ""
            problems.append(f"{where}{at}: {message}")
        raise ConfigError(source, problems) from None


def key_path(loc: tuple[int | str, ...]) -> str:
    """``('listeners', 1, 'port')`` -> ``listeners[1].port``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"^\s*((?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'))*)\s*="
)


def _split_key(key: str) -> list[str]:
    parts = re.findall(r"[A-Za-z0-9_-]+|\"[^\"]*\"|'[^']*'", key)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


class _KeyLines:
    """Maps key paths to the line that sets them (tables, array tables, dotted keys)."""

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple[int | str, ...], int] = {}
        counts: dict[tuple[str, ...], int] = {}
        table: tuple[int | str, ...] = ()
        for number, line in enumerate(text.splitlines(), start=1):
            header = _HEADER.match(line)
            if header:
                # A parent that is an array of tables means its latest element:
                # [[bridges.rules]] -> ("bridges", <current bridge>, "rules", <n>).
                names = _split_key(header.group(2))
                resolved: list[int | str] = []
                for i, name in enumerate(names):
                    resolved.append(name)
                    parent = tuple(str(p) for p in resolved)
                    if i < len(names) - 1 and parent in counts:
                        resolved.append(counts[parent] - 1)
                if header.group(1) == "[[":
                    base = tuple(str(p) for p in resolved)
                    index = counts.get(base, 0)
                    counts[base] = index + 1
                    table = (*resolved, index)
                else:
                    table = tuple(resolved)
                self.lines.setdefault(table, number)
                continue
            key = _KEY.match(line)
            if key:
                self.lines.setdefault((*table, *_split_key(key.group(1))), number)

    def find(self, loc: tuple[int | str, ...]) -> int | None:
        for end in range(len(loc), 0, -1):
            line = self.lines.get(loc[:end])
            if line is not None:
                return line
        return None


@dataclass(frozen=True, slots=True)
class Overrides:
    """Command-line flags, which win over the file."""

    listen: tuple[tuple[str, int], ...] = ()
    data_dir: Path | None = None
    log_level: str | None = None

    def args(self) -> tuple[str, ...]:
        """The flags again, to re-apply after a reload."""
        out: list[str] = []
        for host, port in self.listen:
            out += ["--listen", f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
        if self.data_dir is not None:
            out += ["--data-dir", str(self.data_dir)]
        if self.log_level is not None:
            out += ["--log-level", self.log_level]
        return tuple(out)

    def apply(self, config: Config) -> Config:
        changes: dict[str, Any] = {}
        if self.listen:
            changes["listeners"] = [ListenerConfig(host=h, port=p) for h, p in self.listen]
        if self.data_dir is not None:
            changes["data_dir"] = self.data_dir
        if self.log_level is not None:
            changes["log"] = LogConfig.model_validate({"level": self.log_level})
        return config.model_copy(update=changes) if changes else config


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6; ``:PORT`` means all interfaces)."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(f"{text!r} is not HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{text!r}: port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: port {port} is outside 0..65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", port


def reloadable_fields(model: type[BaseModel]) -> dict[str, bool]:
    """Field name -> whether SIGHUP applies it."""
    return {name: bool(_reload_mark(field)) for name, field in model.model_fields.items()}


# ----------------------------------------------------------------------- reload or restart


@dataclass(frozen=True, slots=True)
class Change:
    """One option that differs between two configs, and whether SIGHUP applies it."""

    path: str
    reloadable: bool


def _reload_mark(field: Any) -> bool | None:
    """The ``reload=`` a field declares (None: it declares nothing)."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and "reload" in extra:
        return bool(extra["reload"])
    return None


def config_changes(old: Config, new: Config) -> list[Change]:
    """Every option that differs from ``old`` in ``new``, each with the ``reload=`` its
    declaration carries.

    A table without a mark of its own is compared option by option. So is a list of
    tables whose length did not change (``listeners[0].acl_file`` reloads while
    ``listeners[0].port`` does not); a list that grew or shrank counts as a change of
    the list itself. An option that declares nothing needs a restart."""
    out: list[Change] = []
    _diff(old, new, (), None, out)
    return out


def _diff(
    old: object, new: object, loc: tuple[int | str, ...], mark: bool | None, out: list[Change]
) -> None:
    if old == new:
        return
    if isinstance(old, BaseModel) and type(old) is type(new):
        if mark is None:
            for name, field in type(old).model_fields.items():
                _diff(
                    getattr(old, name), getattr(new, name), (*loc, name), _reload_mark(field), out
                )
            return
    elif (
        isinstance(old, list)
        and isinstance(new, list)
        and len(old) == len(new)
        and all(isinstance(item, BaseModel) for item in (*old, *new))
    ):
        for i, (before, after) in enumerate(zip(old, new, strict=True)):
            _diff(before, after, (*loc, i), None, out)
        return
    out.append(Change(key_path(loc), bool(mark)))
