"""The firmware bridge, gateway side: MQTT-SN 1.2 for microcontroller sensors.

``codec`` and ``packets`` are the sans-IO protocol (bytes only there), ``uart`` the
framing of MQTT-SN messages on a serial line (COBS + CRC-16, see
``firmware-bridge/UART.md``), ``gateway`` the dispatcher of the pure gateway logic
that makes each MQTT-SN client a session of the broker, split by concern into small
modules (``README.md`` in this folder has the table and follows one PUBLISH through
them). The UDP and serial transports live in the shell (``gateway.net.mqttsn``).
Nothing here is imported unless ``[mqttsn]`` is configured.
"""
