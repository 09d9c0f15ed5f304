# mypy: ignore-errors
# ruff: noqa
"""dbusmock template: BlueZ 5 as bleak uses it, for tests without Bluetooth hardware.

The machine that runs the tests has no Bluetooth in its kernel, so bluetoothd cannot
run; this fake stands in for it on a private system bus (python-dbusmock), and the
real bleak talks to it over D-Bus exactly as it talks to BlueZ. It extends dbusmock's
bluez5 template, which lacks what a BLE central needs (correctly typed advertisement
data, adverts after discovery starts, GATT, notifications, link loss).

Methods on org.bluez.Mock at "/" (besides the stock AddAdapter, RemoveAdapter, ...):
  AddLEDevice(adapter, address, name, rssi, mfr a{qay}, svc a{say}, uuids as) -> path
  Advertise(device_path, rssi, mfr a{qay}, svc a{say}, uuids as)
  AdvertiseBurst(paths ao, uuid s, payloads aay)     one service-data advert per device
  StartTraffic(paths ao, per_second d, seconds d)    BTHome adverts on a timer (benchmark)
  TrafficCount() -> t                                adverts StartTraffic emitted so far
  SetBeacon(device_path, interval_ms)                re-advertise while discovering
  AddGattService(device_path, handle, uuid) -> path
  AddGattCharacteristic(service_path, handle, uuid, flags as, value ay) -> path
  Notify(char_path, value ay)
  GetWrites(char_path) -> aay
  DropConnection(device_path)                        link loss
"""

import ctypes
import struct
import time

import dbus

from dbusmock import OBJECT_MANAGER_IFACE, mockobject
from dbusmock.templates import bluez5 as _bluez5
from dbusmock.templates.bluez5 import *  # re-export the stock template's methods

BUS_NAME = "org.bluez"
MAIN_OBJ = "/"
SYSTEM_BUS = True
IS_OBJECT_MANAGER = True

MOCK_IFACE = "org.bluez.Mock"
DEVICE_IFACE = "org.bluez.Device1"
GATT_SERVICE_IFACE = "org.bluez.GattService1"
GATT_CHAR_IFACE = "org.bluez.GattCharacteristic1"
BTHOME_UUID = "0000fcd2-0000-1000-8000-00805f9b34fb"


def load(mock, parameters):
    _bluez5.load(mock, parameters)


# The mock runs a GLib main loop (dbus-python); reach g_timeout_add through ctypes.
_glib = ctypes.CDLL("libglib-2.0.so.0")
_SOURCE_FUNC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_glib.g_timeout_add.argtypes = [ctypes.c_uint, _SOURCE_FUNC, ctypes.c_void_p]
_glib.g_source_remove.argtypes = [ctypes.c_uint]
_timers = {}  # key -> (source id, C callback kept alive)
_traffic = {"count": 0}


def _ay(value):
    # dbusmock's UpdateProperties cannot wrap dbus.ByteArray in a variant
    return dbus.Array([dbus.Byte(b) for b in bytes(value)], signature="y")


def _emit_added(path, iface, props):
    mockobject.objects["/"].EmitSignal(
        OBJECT_MANAGER_IFACE,
        "InterfacesAdded",
        "oa{sa{sv}}",
        [dbus.ObjectPath(path), {iface: props}],
    )


def _set(obj, iface, **changes):
    obj.UpdateProperties(iface, changes)


def _connect(device):
    adapter = mockobject.objects.get(str(device.props[DEVICE_IFACE]["Adapter"]))
    if adapter is None:
        raise dbus.exceptions.DBusException("adapter gone", name="org.bluez.Error.Failed")
    _set(device, DEVICE_IFACE, Connected=dbus.Boolean(True))
    _set(device, DEVICE_IFACE, ServicesResolved=dbus.Boolean(True))


def _disconnect(device):
    _set(device, DEVICE_IFACE, ServicesResolved=dbus.Boolean(False), Connected=dbus.Boolean(False))


@dbus.service.method(MOCK_IFACE, in_signature="sssna{qay}a{say}as", out_signature="s")
def AddLEDevice(self, adapter_name, address, name, rssi, manufacturer_data, service_data, uuids):
    adapter_path = "/org/bluez/" + adapter_name
    path = adapter_path + "/dev_" + address.replace(":", "_").upper()
    props = {
        "Address": dbus.String(address),
        "AddressType": dbus.String("random"),
        "Alias": dbus.String(name or address.replace(":", "-")),
        "Adapter": dbus.ObjectPath(adapter_path),
        "Paired": dbus.Boolean(False),
        "Bonded": dbus.Boolean(False),
        "Trusted": dbus.Boolean(False),
        "Blocked": dbus.Boolean(False),
        "LegacyPairing": dbus.Boolean(False),
        "Connected": dbus.Boolean(False),
        "ServicesResolved": dbus.Boolean(False),
        "UUIDs": dbus.Array(list(uuids), signature="s"),
        "ManufacturerData": dbus.Dictionary(
            {dbus.UInt16(k): dbus.ByteArray(bytes(v)) for k, v in manufacturer_data.items()},
            signature="qv",
        ),
        "ServiceData": dbus.Dictionary(
            {dbus.String(k): dbus.ByteArray(bytes(v)) for k, v in service_data.items()},
            signature="sv",
        ),
        "RSSI": dbus.Int16(rssi),
    }
    if name:
        props["Name"] = dbus.String(name)
    self.AddObject(
        path,
        DEVICE_IFACE,
        props,
        [
            ("Connect", "", "", lambda dev: _connect(dev)),
            ("Disconnect", "", "", lambda dev: _disconnect(dev)),
            ("Pair", "", "", ""),
            ("CancelPairing", "", "", ""),
        ],
    )
    _emit_added(path, DEVICE_IFACE, props)
    return path


def _advertise(dev, rssi, manufacturer_data, service_data, uuids):
    changes = {"RSSI": dbus.Int16(rssi)}
    if manufacturer_data:
        md = dict(dev.props[DEVICE_IFACE]["ManufacturerData"])
        md.update({dbus.UInt16(k): dbus.ByteArray(bytes(v)) for k, v in manufacturer_data.items()})
        changes["ManufacturerData"] = dbus.Dictionary(md, signature="qv")
    if service_data:
        sd = dict(dev.props[DEVICE_IFACE]["ServiceData"])
        sd.update({dbus.String(k): dbus.ByteArray(bytes(v)) for k, v in service_data.items()})
        changes["ServiceData"] = dbus.Dictionary(sd, signature="sv")
    if uuids:
        changes["UUIDs"] = dbus.Array(
            sorted(set(dev.props[DEVICE_IFACE]["UUIDs"]) | set(uuids)), signature="s"
        )
    _set(dev, DEVICE_IFACE, **changes)


@dbus.service.method(MOCK_IFACE, in_signature="ona{qay}a{say}as", out_signature="")
def Advertise(self, device_path, rssi, manufacturer_data, service_data, uuids):
    """One received advertisement: bluetoothd merges it into the device's properties."""
    _advertise(mockobject.objects[device_path], rssi, manufacturer_data, service_data, uuids)


@dbus.service.method(MOCK_IFACE, in_signature="aosaay", out_signature="")
def AdvertiseBurst(self, paths, uuid, payloads):
    for path, payload in zip(paths, payloads):
        _advertise(mockobject.objects[path], -60, {}, {uuid: payload}, [])


@dbus.service.method(MOCK_IFACE, in_signature="aodd", out_signature="")
def StartTraffic(self, paths, per_second, seconds):
    """BTHome adverts (a round counter as temperature: each advert new) round-robin over ``paths`` at
    ``per_second`` for ``seconds``; TrafficCount says how many were emitted."""
    paths = [str(p) for p in paths]
    old = _timers.pop("traffic", None)
    if old:
        _glib.g_source_remove(old[0])
    _traffic["count"] = 0
    start = time.monotonic()
    state = {"i": 0}

    def tick(_data):
        elapsed = time.monotonic() - start
        due = min(int(elapsed * per_second), int(seconds * per_second))
        while _traffic["count"] < due:
            n = _traffic["count"]
            path = paths[n % len(paths)]
            round_ = n // len(paths)
            payload = bytes([0x40, 0x02]) + struct.pack("<h", round_ % 30000)
            _advertise(mockobject.objects[path], -60, {}, {BTHOME_UUID: payload}, [])
            _traffic["count"] = n + 1
        if elapsed >= seconds and _traffic["count"] >= int(seconds * per_second):
            _timers.pop("traffic", None)
            return 0
        return 1

    cb = _SOURCE_FUNC(tick)
    _timers["traffic"] = (_glib.g_timeout_add(5, cb, None), cb)


@dbus.service.method(MOCK_IFACE, in_signature="", out_signature="t")
def TrafficCount(self):
    return dbus.UInt64(_traffic["count"])


@dbus.service.method(MOCK_IFACE, in_signature="oqs", out_signature="s")
def AddGattService(self, device_path, handle, uuid):
    path = f"{device_path}/service{handle:04x}"
    props = {
        "UUID": dbus.String(uuid),
        "Device": dbus.ObjectPath(device_path),
        "Primary": dbus.Boolean(True),
        "Includes": dbus.Array([], signature="o"),
        "Handle": dbus.UInt16(handle),
    }
    self.AddObject(path, GATT_SERVICE_IFACE, props, [])
    _emit_added(path, GATT_SERVICE_IFACE, props)
    return path


def _read_value(char, options):
    return dbus.ByteArray(bytes(char.props[GATT_CHAR_IFACE]["Value"]))


def _write_value(char, value, options):
    char.writes.append(bytes(value))
    char.props[GATT_CHAR_IFACE]["Value"] = _ay(value)


def _start_notify(char):
    _set(char, GATT_CHAR_IFACE, Notifying=dbus.Boolean(True))


def _stop_notify(char):
    _set(char, GATT_CHAR_IFACE, Notifying=dbus.Boolean(False))


@dbus.service.method(MOCK_IFACE, in_signature="oqsasay", out_signature="s")
def AddGattCharacteristic(self, service_path, handle, uuid, flags, value):
    path = f"{service_path}/char{handle:04x}"
    props = {
        "UUID": dbus.String(uuid),
        "Service": dbus.ObjectPath(service_path),
        "Value": _ay(value),
        "Notifying": dbus.Boolean(False),
        "Flags": dbus.Array(flags, signature="s"),
        "Handle": dbus.UInt16(handle),
        "MTU": dbus.UInt16(247),
    }
    self.AddObject(
        path,
        GATT_CHAR_IFACE,
        props,
        [
            ("ReadValue", "a{sv}", "ay", _read_value),
            ("WriteValue", "aya{sv}", "", _write_value),
            ("StartNotify", "", "", _start_notify),
            ("StopNotify", "", "", _stop_notify),
        ],
    )
    mockobject.objects[path].writes = []
    _emit_added(path, GATT_CHAR_IFACE, props)
    return path


@dbus.service.method(MOCK_IFACE, in_signature="oay", out_signature="")
def Notify(self, char_path, value):
    char = mockobject.objects[char_path]
    if char.props[GATT_CHAR_IFACE]["Notifying"]:
        _set(char, GATT_CHAR_IFACE, Value=_ay(value))
    else:
        char.props[GATT_CHAR_IFACE]["Value"] = _ay(value)


@dbus.service.method(MOCK_IFACE, in_signature="o", out_signature="aay")
def GetWrites(self, char_path):
    return [dbus.ByteArray(w) for w in mockobject.objects[char_path].writes]


@dbus.service.method(MOCK_IFACE, in_signature="o", out_signature="")
def DropConnection(self, device_path):
    _disconnect(mockobject.objects[device_path])


@dbus.service.method(MOCK_IFACE, in_signature="ou", out_signature="")
def SetBeacon(self, device_path, interval_ms):
    """Re-emit RSSI every interval_ms while the adapter discovers (0 stops), as a powered
    peripheral in range does: BleakClient(address) needs an advert after its scan starts."""
    old = _timers.pop(device_path, None)
    if old:
        _glib.g_source_remove(old[0])
    if not interval_ms:
        return
    dev = mockobject.objects[device_path]
    adapter_path = str(dev.props[DEVICE_IFACE]["Adapter"])

    def tick(_data):
        if device_path not in mockobject.objects:
            _timers.pop(device_path, None)
            return 0
        adapter = mockobject.objects.get(adapter_path)
        if adapter is not None and adapter.props[_bluez5.ADAPTER_IFACE]["Discovering"]:
            _set(dev, DEVICE_IFACE, RSSI=dev.props[DEVICE_IFACE]["RSSI"])
        return 1

    cb = _SOURCE_FUNC(tick)
    _timers[device_path] = (_glib.g_timeout_add(interval_ms, cb, None), cb)
