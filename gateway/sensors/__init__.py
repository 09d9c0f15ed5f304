"""Driver glue: the gateway's side of the sensors in ``drivers/``.

``drivers/`` holds what is reusable without the gateway (the ``Reading`` contract, pure
parsers, the serial and BLE transports); this package composes those pieces with the
broker's in-process client: ``hub`` (serial devices -> readings -> topics, Home
Assistant discovery, downlink, health), ``ble`` (adverts and GATT devices, loaded only
when BLE is configured), and the settings of ``[[ble]]`` devices and of devices'
``fields`` tables as plain data.

Importing this package loads nothing: the config reads the settings modules without
pulling in the transports.
"""
