"""Sensor drivers: pure parsers per device and thin serial/BLE transports."""
