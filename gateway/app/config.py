"""The one config file: TOML, validated by pydantic, errors naming key path and line.

Every option has a default, so an empty file (or none) is the embedded default
config: one listener on 127.0.0.1:1883, anonymous clients allowed. Options marked
``reload=True`` are applied on SIGHUP; the rest need a restart.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Union, cast, get_args, get_origin, get_type_hints

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from gateway.app.runtime import (
    LAZY_SETTINGS,
    AuthSettings,
    ConfigError,
    GatewaySettings,
    HealthSettings,
    ListenerSettings,
    LogSettings,
    RuntimeConfig,
    TapSettings,
)
from gateway.bridge.rules import rule_errors
from gateway.bridge.settings import BridgeSettings, OutboxSettings, RuleSettings, TlsSettings
from gateway.broker.settings import BrokerSettings
from gateway.mqtt.topics import filter_error, topic_name_error
from gateway.mqttsn.settings import MqttSnSerialSettings, MqttSnSettings, UdpSettings
from gateway.net.http_settings import HTTPSettings
from gateway.sensors.ble_settings import (
    BEACON_FORMATS,
    GATT_FORMATS,
    BleDeviceSettings,
    GattCharacteristicSettings,
    GattFieldSettings,
)
from gateway.sensors.field_settings import FieldSettings
from gateway.sensors.settings import (
    BluetoothSettings,
    HomeAssistantSettings,
    ReadingsSettings,
    SerialSettings,
)
from gateway.store.settings import StoreSettings


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------- models
#
# Each TOML table is a settings dataclass (``option`` fields: default, reload, bounds);
# ``section_model`` makes its pydantic model from those fields, on a base class that
# adds what only a validator can check (files readable, names unique...).
# ``settings_from`` turns a validated model back into the dataclass.

#: Names the runtime's annotations use without importing them (see gateway.app.runtime).
_LAZY_NAMES: dict[str, Any] = {
    name: getattr(importlib.import_module(module), name) for name, module in LAZY_SETTINGS.items()
}

#: Settings dataclass -> its model, and back.
_MODELS: dict[type, type[_Model]] = {}
_SETTINGS: dict[type[BaseModel], type] = {}


def section_model(
    settings: type,
    base: type[_Model] = _Model,
    *,
    also: tuple[type, str] | None = None,
    extra: dict[str, Any] | None = None,
    name: str = "",
) -> type[_Model]:
    """The model of ``settings``'s options: every field but internal ones and ones
    written in another table; ``also = (dataclass, table)`` adds the fields of another
    dataclass that are written in this table; ``extra`` adds fields only the file has."""
    spec: dict[str, Any] = {}
    for owner, section in ((settings, ""), *([also] if also else [])):
        hints = get_type_hints(owner, localns=_LAZY_NAMES)
        for f in dataclasses.fields(owner):
            if f.metadata.get("internal") or f.metadata.get("section", "") != section:
                continue
            spec[f.name] = (_model_type(hints[f.name]), _model_field(f))
    spec.update(extra or {})
    model: type[_Model] = create_model(
        name or settings.__name__.removesuffix("Settings") + "Config",
        __base__=base,
        __module__=__name__,
        **spec,
    )
    _MODELS[settings] = model
    _SETTINGS[model] = settings
    return model


def _model_field(f: dataclasses.Field[Any]) -> Any:
    kwargs = dict(f.metadata.get("bounds", {}))
    kwargs["json_schema_extra"] = {"reload": f.metadata.get("reload", False)}
    if isinstance(f.default, tuple):
        default = f.default
        return Field(default_factory=lambda: list(default), **kwargs)
    if f.default is not dataclasses.MISSING:
        return Field(f.default, **kwargs)
    factory = f.default_factory
    if factory is dataclasses.MISSING:
        return Field(**kwargs)  # required
    if isinstance(factory, type) and factory in _MODELS:
        return Field(default_factory=_MODELS[factory], **kwargs)
    made = factory()
    if isinstance(made, tuple) and made and dataclasses.is_dataclass(made[0]):
        return Field(default_factory=lambda: [_to_model(item) for item in factory()], **kwargs)
    return Field(default_factory=factory, **kwargs)


def _model_type(hint: Any) -> Any:
    """A dataclass's type hint with the settings dataclasses in it replaced by models."""
    if isinstance(hint, type) and hint in _MODELS:
        return _MODELS[hint]
    origin, args = get_origin(hint), get_args(hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[_model_type(args[0])]  # type: ignore[misc]  # a TOML array
    if origin is tuple:
        return tuple[tuple(_model_type(a) for a in args)]  # type: ignore[misc]
    if origin is dict:
        return dict[_model_type(args[0]), _model_type(args[1])]  # type: ignore[misc]
    if origin in (Union, UnionType):
        return Union[tuple(_model_type(a) for a in args)]  # noqa: UP007  # an optional table
    return hint


def _to_model(value: Any) -> Any:
    model = _MODELS[type(value)]
    return model(**{name: getattr(value, name) for name in model.model_fields})


def settings_from(model: BaseModel, **given: Any) -> Any:
    """The settings dataclass of a validated model; ``given`` supplies the fields the
    file does not hold as they are (internal ones, ones from another table)."""
    settings = next(_SETTINGS[c] for c in type(model).__mro__ if c in _SETTINGS)
    hints = get_type_hints(settings, localns=_LAZY_NAMES)
    values = dict(given)
    for f in dataclasses.fields(settings):
        if f.name not in values and f.name in type(model).model_fields:
            values[f.name] = _settings_value(getattr(model, f.name), hints[f.name])
    return settings(**values)


def _settings_value(value: Any, hint: Any) -> Any:
    if isinstance(value, BaseModel):
        convert = getattr(value, "to_settings", None)
        return convert() if convert is not None else settings_from(value)
    if isinstance(value, list | tuple):
        args = get_args(hint)
        inner = args[0] if args else Any
        return tuple(_settings_value(v, inner) for v in value)
    if isinstance(value, dict):
        args = get_args(hint)
        return {k: _settings_value(v, args[1] if args else Any) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


# ----------------------------------------------------------------------- checks


def _fields_of(model: BaseModel) -> Callable[[str], Any]:
    """A model's field values by name (for checks declared on a base class)."""
    values: dict[str, Any] = model.__dict__
    return values.__getitem__


def _readable(path: str | None) -> str | None:
    """A file that must be readable now (checked where the config is validated)."""
    if path is not None:
        try:
            with Path(path).open("rb"):
                pass
        except OSError as exc:
            raise ValueError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return path


def _parsed(path: str | None, module: str, parser: str) -> str | None:
    """A readable file that ``module.parser`` accepts; the module is imported only when a
    file is configured (it costs memory otherwise)."""
    if _readable(path) is None:
        return path
    assert path is not None
    parse = getattr(importlib.import_module(module), parser)
    try:
        parse(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path!r}: {exc}") from None
    return path


def _password_file(path: str | None) -> str | None:
    return _parsed(path, "gateway.broker.auth", "parse_password_file")


def _acl_file(path: str | None) -> str | None:
    return _parsed(path, "gateway.broker.acl", "parse_acl_file")


def _topic_level(value: str) -> str:
    if set(value) & set("/+#$ \x00"):
        raise ValueError("must not contain '/', '+', '#', '$' or spaces (it is a topic level)")
    return value


class _TLSChecks(_Model):
    """The TLS options every listener shares (``TLSOptions``): files readable, a CA
    when client certificates are required, and the files loaded as the gateway will
    (a key that does not match its certificate is found here, not at start-up)."""

    _files = field_validator("certfile", "keyfile", "cafile", check_fields=False)(_readable)

    def _check_tls(self, serves_tls: bool) -> None:
        get = _fields_of(self)
        if get("require_certificate") and get("cafile") is None:
            raise ValueError("require_certificate needs cafile (the CA that signs clients)")
        if serves_tls:
            import ssl

            from gateway.net.tls import server_context

            try:
                server_context(settings_from(self))
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ValueError(f"cannot use certfile/keyfile/cafile: {exc}") from None


class _ListenerChecks(_TLSChecks):
    """One place clients connect (mosquitto's ``listener`` with per-listener settings)."""

    _passwords = field_validator("password_file", check_fields=False)(_password_file)
    _acl = field_validator("acl_file", check_fields=False)(_acl_file)

    @model_validator(mode="after")
    def _consistent(self) -> Any:
        get = _fields_of(self)
        kind = get("type")
        tls = kind in ("tls", "websocket-tls")
        if tls and (get("certfile") is None or get("keyfile") is None):
            raise ValueError(f"type {kind!r} needs certfile and keyfile")
        if not tls:
            options = ("certfile", "keyfile", "cafile", "require_certificate")
            given = [o for o in options if get(o)]
            if given or get("use_identity_as_username"):
                raise ValueError(
                    f"{', '.join(given or ['use_identity_as_username'])} only apply to "
                    "type 'tls' or 'websocket-tls'"
                )
        if get("use_identity_as_username") and not get("require_certificate"):
            raise ValueError("use_identity_as_username needs require_certificate = true")
        if not str(get("path")).startswith("/"):
            raise ValueError(f"path {get('path')!r} must start with '/'")
        self._check_tls(tls)
        return self


class _BrokerChecks(_Model):
    """Broker limits and switches (see the example config for each meaning)."""

    @field_validator("deny_subscriptions", check_fields=False)
    @classmethod
    def _filters_valid(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for i, topic_filter in enumerate(value):
            error = filter_error(topic_filter)
            if error:
                raise ValueError(f"entry {i} ({topic_filter!r}): {error}")
        return value


class _GatewayChecks(_Model):
    @field_validator("id", check_fields=False)
    @classmethod
    def _topic_level(cls, value: str) -> str:
        if not value or set(value) & set("/+#$ \x00"):
            raise ValueError("must be non-empty without '/', '+', '#', '$' or spaces")
        return value


class _SerialChecks(_Model):
    _name = field_validator("name", check_fields=False)(_topic_level)

    @field_validator("stopbits", check_fields=False)
    @classmethod
    def _stopbits(cls, value: float) -> float:
        if value not in (1, 1.5, 2):
            raise ValueError("must be 1, 1.5 or 2")
        return value


_BLE_ADDRESS = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _gatt_uuid(value: str | None) -> str | None:
    """A characteristic UUID: 128-bit form, or a 16-bit SIG one as 4 hex digits."""
    if value is None:
        return None
    if re.fullmatch(r"(0x)?[0-9a-fA-F]{4}", value):
        return f"0000{value[-4:].lower()}-0000-1000-8000-00805f9b34fb"
    if not _UUID.match(value):
        raise ValueError(f"{value!r} is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx or 2a19)")
    return value.lower()


class _GattCharacteristicChecks(_Model):
    _uuid = field_validator("uuid", check_fields=False)(_gatt_uuid)


class _BleDeviceChecks(_Model):
    """One ``[[ble]]`` device."""

    _command_uuid = field_validator("command_uuid", check_fields=False)(_gatt_uuid)

    @field_validator("name", check_fields=False)
    @classmethod
    def _topic_level(cls, value: str) -> str:
        if set(value) & set("/+#$ \x00") or value == "adapter":
            raise ValueError("must not contain '/', '+', '#', '$' or spaces, nor be 'adapter'")
        return value

    @field_validator("address", check_fields=False)
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and not _BLE_ADDRESS.match(value):
            raise ValueError(f"{value!r} is not a Bluetooth address like A4:C1:38:12:34:56")
        return None if value is None else value.upper()

    @field_validator("bindkey", check_fields=False)
    @classmethod
    def _bindkey(cls, value: str | None) -> str | None:
        if value is not None:
            from drivers.parsers.ble.ccm import parse_key

            parse_key(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Any:
        get = _fields_of(self)
        fmt, address, beacon = get("format"), get("address"), get("beacon")
        gatt = fmt in GATT_FORMATS
        if (address is None) == (beacon is None):
            raise ValueError("give the device's address, or (for a beacon) its beacon identity")
        if gatt and address is None:
            raise ValueError("a GATT device needs its address")
        if beacon is not None and fmt not in ("auto", *BEACON_FORMATS):
            raise ValueError("beacon applies to formats 'ibeacon' and 'eddystone'")
        if get("bindkey") is not None and fmt not in ("auto", "bthome", "mibeacon"):
            raise ValueError("bindkey applies to formats 'bthome' and 'mibeacon'")
        if fmt == "gatt" and not get("characteristics") and get("command_uuid") is None:
            raise ValueError("format 'gatt' needs characteristics or a command_uuid")
        if get("characteristics") and not gatt:
            raise ValueError("characteristics apply to formats 'gatt' and 'lywsd03mmc'")
        if get("command_uuid") is not None and not gatt:
            raise ValueError("command_uuid applies to formats 'gatt' and 'lywsd03mmc'")
        return self


class _BluetoothChecks(_Model):
    """``[bluetooth]``: the adapter, its scanner and the watchdog."""

    @field_validator("allow", check_fields=False)
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for i, pattern in enumerate(value):
            if not re.fullmatch(r"[0-9A-Fa-f:*?]+", pattern):
                raise ValueError(f"entry {i} ({pattern!r}) is not an address pattern (A4:C1:38:*)")
        return value

    @model_validator(mode="after")
    def _backoff(self) -> Any:
        get = _fields_of(self)
        if get("reconnect_max") < get("reconnect_min"):
            raise ValueError("reconnect_max must not be below reconnect_min")
        return self


class _BridgeTlsChecks(_Model):
    @model_validator(mode="after")
    def _files(self) -> Any:
        get = _fields_of(self)
        if (get("cert_file") is None) != (get("key_file") is None):
            raise ValueError("cert_file and key_file go together (mutual TLS)")
        for name in ("ca_file", "cert_file", "key_file"):
            path = get(name)
            if path is not None and not Path(path).is_file():
                raise ValueError(f"{name}: no such file: {path}")
        return self


class _BridgeRuleChecks(_Model):
    @model_validator(mode="after")
    def _valid(self) -> Any:
        problems = rule_errors(settings_from(self))
        if problems:
            raise ValueError("; ".join(problems))
        return self


class _BridgeChecks(_Model):
    _name = field_validator("name", check_fields=False)(_topic_level)

    @model_validator(mode="after")
    def _remote(self) -> Any:
        get = _fields_of(self)
        if not get("address") and not get("addresses"):
            raise ValueError("give the remote broker as address (or addresses, tried in turn)")
        for text in self.remote_addresses():
            parse_remote(text, get("tls").enabled)
        if get("reconnect_max") < get("reconnect_min"):
            raise ValueError("reconnect_max must not be below reconnect_min")
        return self

    def remote_addresses(self) -> list[str]:
        get = _fields_of(self)
        return ([get("address")] if get("address") else []) + list(get("addresses"))

    def to_settings(self) -> BridgeSettings:
        tls = self.__dict__["tls"].enabled
        addresses = tuple(parse_remote(a, tls) for a in self.remote_addresses())
        settings: BridgeSettings = settings_from(self, addresses=addresses)
        return settings


class _AuthChecks(_Model):
    """Defaults for listeners that say nothing, and the failed-login slowdown."""

    _passwords = field_validator("password_file", check_fields=False)(_password_file)
    _acl = field_validator("acl_file", check_fields=False)(_acl_file)

    @model_validator(mode="after")
    def _delays(self) -> Any:
        get = _fields_of(self)
        if get("failed_login_delay_max") < get("failed_login_delay"):
            raise ValueError("failed_login_delay_max is below failed_login_delay")
        return self


class _HTTPChecks(_TLSChecks):
    """The HTTP listener of ``/metrics``, ``/api/status`` and the status page: HTTPS
    with certfile and keyfile; who may read from a password file or a token file."""

    _passwords = field_validator("password_file", check_fields=False)(_password_file)

    @field_validator("token_file", check_fields=False)
    @classmethod
    def _token(cls, path: str | None) -> str | None:
        if _readable(path) is not None:
            from gateway.net.http import MIN_TOKEN_LENGTH, read_token

            assert path is not None
            if len(read_token(Path(path))) < MIN_TOKEN_LENGTH:
                raise ValueError(
                    f"the token in {path!r} is shorter than {MIN_TOKEN_LENGTH} characters"
                )
        return path

    @model_validator(mode="after")
    def _tls(self) -> Any:
        get = _fields_of(self)
        https = get("certfile") is not None
        if https != (get("keyfile") is not None):
            raise ValueError("certfile and keyfile go together (HTTPS)")
        if not https and (get("cafile") or get("require_certificate")):
            raise ValueError("cafile and require_certificate need certfile and keyfile")
        self._check_tls(https)
        return self


class _ConfigChecks(_Model):
    @field_validator("serial", "ble", "bridges", check_fields=False)
    @classmethod
    def _unique_names(cls, value: tuple[Any, ...], info: ValidationInfo) -> tuple[Any, ...]:
        names = [item.name for item in value]
        what = {"serial": "serial devices", "ble": "BLE devices"}.get(
            info.field_name or "", "bridges"
        )
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two {what} are named {name!r}")
        return value


ListenerConfig = section_model(ListenerSettings, _ListenerChecks)
BrokerConfig = section_model(BrokerSettings, _BrokerChecks)
StoreConfig = section_model(StoreSettings)
GatewayConfig = section_model(GatewaySettings, _GatewayChecks)
ReadingsConfig = section_model(ReadingsSettings)
FieldConfig = section_model(FieldSettings)
SerialConfig = section_model(SerialSettings, _SerialChecks)
HomeAssistantConfig = section_model(HomeAssistantSettings)
TapsConfig = section_model(TapSettings)
BluetoothConfig = section_model(BluetoothSettings, _BluetoothChecks)
GattFieldConfig = section_model(GattFieldSettings)
GattCharacteristicConfig = section_model(GattCharacteristicSettings, _GattCharacteristicChecks)
BleDeviceConfig = section_model(BleDeviceSettings, _BleDeviceChecks)
BridgeTlsConfig = section_model(TlsSettings, _BridgeTlsChecks)
BridgeRuleConfig = section_model(RuleSettings, _BridgeRuleChecks)
OutboxConfig = section_model(OutboxSettings)
BridgeConfig = section_model(
    BridgeSettings,
    _BridgeChecks,
    # The file names remote brokers as text; BridgeSettings.addresses holds them parsed.
    extra={
        "address": (str | None, Field(None, json_schema_extra={"reload": True})),
        "addresses": (list[str], Field(default_factory=list, json_schema_extra={"reload": True})),
    },
)
AuthConfig = section_model(AuthSettings, _AuthChecks, also=(BrokerSettings, "auth"))
LogConfig = section_model(LogSettings)
HealthConfig = section_model(HealthSettings)


# ----------------------------------------------------------------------- [mqttsn]
# The firmware bridge (MQTT-SN 1.2): its transports, predefined topics and bounds.


class _MqttSnUdpChecks(_Model):
    @field_validator("broadcast", check_fields=False)
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            parse_remote(text, False)
        return value


class _MqttSnChecks(_Model):
    @field_validator("predefined_topics", check_fields=False)
    @classmethod
    def _predefined(cls, value: dict[int, str]) -> dict[int, str]:
        for topic_id, name in value.items():
            if not 0 < topic_id < 0xFFFF:
                raise ValueError(f"topic id {topic_id} is not 1..65534")
            error = topic_name_error(name)
            if error:
                raise ValueError(f"topic id {topic_id} ({name!r}): {error}")
        return value

    @model_validator(mode="after")
    def _names(self) -> Any:
        get = _fields_of(self)
        labels = [u.name or f"udp {u.host}:{u.port}" for u in get("udp")]
        labels += [s.name for s in get("serial")]
        for label in labels:
            if labels.count(label) > 1:
                raise ValueError(f"two MQTT-SN transports are named {label!r}")
        return self


MqttSnUdpConfig = section_model(UdpSettings, _MqttSnUdpChecks, name="MqttSnUdpConfig")
MqttSnSerialConfig = section_model(MqttSnSerialSettings)
MqttSnConfig = section_model(MqttSnSettings, _MqttSnChecks)
HTTPConfig = section_model(HTTPSettings, _HTTPChecks)
_ConfigModel = section_model(RuntimeConfig, _ConfigChecks, name="ConfigFile")


class Config(_ConfigModel):  # type: ignore[valid-type, misc]
    """The whole file, validated."""

    def to_runtime(
        self, path: Path | None = None, overrides: Overrides | None = None
    ) -> RuntimeConfig:
        """The validated config as plain data for the gateway process."""
        runtime: RuntimeConfig = settings_from(
            self,
            listeners=tuple(self.listener_settings(lc) for lc in self.listeners),
            broker=self.broker_settings(),
            auth=settings_from(self.auth),
            config_path=None if path is None else str(path),
            override_args=overrides.args() if overrides is not None else (),
        )
        return runtime

    def listener_settings(self, lc: BaseModel) -> ListenerSettings:
        """A listener as plain data, what it leaves unsaid taken from ``[auth]``."""
        listener: ListenerSettings = settings_from(lc)
        auth: AuthSettings = settings_from(self.auth)
        return listener.resolved(auth)

    def broker_settings(self) -> BrokerSettings:
        """``[broker]``, with the failed-login delays written in ``[auth]``."""
        auth = self.auth
        settings: BrokerSettings = settings_from(
            self.broker,
            failed_login_delay=auth.failed_login_delay,
            failed_login_delay_max=auth.failed_login_delay_max,
        )
        return settings


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
        return cast(Config, Config.model_validate(data))
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
            changes["listeners"] = [
                ListenerConfig.model_validate({"host": h, "port": p}) for h, p in self.listen
            ]
        if self.data_dir is not None:
            changes["data_dir"] = str(self.data_dir)
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

    A table present in both is compared option by option, and so is a list of tables
    whose length did not change (``listeners[0].acl_file`` reloads while
    ``listeners[0].port`` does not). A table that appeared or went away (``[http]``),
    and a list that grew or shrank (``bridges``), count as a change of the table or
    list itself, with its own mark. An option that declares nothing needs a restart."""
    out: list[Change] = []
    _diff(old, new, (), None, out)
    return out


def _diff(
    old: object, new: object, loc: tuple[int | str, ...], mark: bool | None, out: list[Change]
) -> None:
    if old == new:
        return
    if isinstance(old, BaseModel) and type(old) is type(new):
        # The table's own mark says whether it may come and go; its options say what
        # SIGHUP takes of it.
        for name, field in type(old).model_fields.items():
            _diff(getattr(old, name), getattr(new, name), (*loc, name), _reload_mark(field), out)
        return
    if (
        isinstance(old, list)
        and isinstance(new, list)
        and len(old) == len(new)
        and all(isinstance(item, BaseModel) for item in (*old, *new))
    ):
        for i, (before, after) in enumerate(zip(old, new, strict=True)):
            _diff(before, after, (*loc, i), None, out)
        return
    out.append(Change(key_path(loc), bool(mark)))
