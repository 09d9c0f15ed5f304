"""BLE sensors: the bleak transports (scanner, GATT client), per-device decoding state,
publishing policy, presence and the scanner watchdog. The decoders themselves are in
``drivers.parsers.ble``."""
