# Pico W + BME280 over Wi-Fi/UDP to a Ledge gateway (MQTT-SN). Copy mqttsn.py,
# bme280.py and this file (as main.py) to the board; set the three constants below.
#
# Every PERIOD seconds: read the sensor, publish temperature, humidity and pressure at
# QoS 1 (kept until the gateway acknowledged them, across Wi-Fi drops and gateway
# restarts), then tell the gateway we sleep until the next reading; commands sent to
# .../cmd/led while we slept arrive when we wake.
import asyncio

import machine
import network
from bme280 import BME280
from mqttsn import Client, UDPTransport

WIFI_SSID = "my-network"
WIFI_PASSWORD = "my-password"
GATEWAY = None  # "192.168.1.10", or None to find it (SEARCHGW / ADVERTISE)
PERIOD = 60
CLIENT_ID = "pico-" + "".join("%02x" % b for b in machine.unique_id())
PREFIX = "ledge/firmware/" + CLIENT_ID

led = machine.Pin("LED", machine.Pin.OUT)


def on_message(topic, payload, retained):
    if topic == PREFIX + "/cmd/led":
        led.value(payload in (b"1", b"on"))


async def wifi():
    wlan = network.WLAN(network.STA_IF)
    wlan.active(True)
    if not wlan.isconnected():
        wlan.connect(WIFI_SSID, WIFI_PASSWORD)
        while not wlan.isconnected():
            await asyncio.sleep_ms(500)
    return wlan


async def main():
    await wifi()
    sensor = BME280(machine.I2C(0, sda=machine.Pin(4), scl=machine.Pin(5)))
    client = Client(
        UDPTransport(GATEWAY),
        CLIENT_ID,
        keepalive=PERIOD * 2,
        will=(PREFIX + "/status", b"offline", 1, True),
        on_message=on_message,
    )
    if GATEWAY is None:
        await client.discover()
    await client.connect()
    await client.publish(PREFIX + "/status", b"online", qos=1, retain=True)
    await client.subscribe(PREFIX + "/cmd/#", qos=1)
    while True:
        wlan = await wifi()  # back on the network after a drop
        t, h, p = sensor.read()
        await client.publish(PREFIX + "/temperature", "%.2f" % t, qos=1)
        await client.publish(PREFIX + "/humidity", "%.1f" % h, qos=1)
        await client.publish(PREFIX + "/pressure", "%.1f" % p, qos=1)
        await client.sleep(PERIOD * 2)  # the gateway keeps our messages meanwhile
        await asyncio.sleep(PERIOD)  # machine.lightsleep() saves more, Wi-Fi allowing
        await client.wake()  # what came while asleep, then back to sleep
        print(
            "rssi", wlan.status("rssi"), "resends", client.resends, "reconnects", client.reconnects
        )


asyncio.run(main())
