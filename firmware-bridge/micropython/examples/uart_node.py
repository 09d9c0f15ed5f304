# A board wired to the gateway by a serial line (UART0: GP0 TX, GP1 RX on a Pico; the
# gateway side a USB-serial adapter, [[mqttsn.serial]] in ledge.toml), publishing a
# reading every 10 s. The frames are COBS with a CRC-16 (firmware-bridge/UART.md), so a
# plug-in mid-frame or line noise costs one frame, never the link.
import asyncio

import machine
from mqttsn import Client, UARTTransport

CLIENT_ID = "uart-node-1"
PREFIX = "ledge/firmware/" + CLIENT_ID
adc = machine.ADC(4)  # the RP2040's temperature sensor


async def main():
    uart = machine.UART(0, 115200, tx=machine.Pin(0), rx=machine.Pin(1))
    client = Client(UARTTransport(uart), CLIENT_ID, keepalive=30)
    await client.connect()
    asyncio.create_task(client.keep_alive())
    while True:
        volts = adc.read_u16() * 3.3 / 65535
        celsius = 27 - (volts - 0.706) / 0.001721
        await client.publish(PREFIX + "/temperature", "%.1f" % celsius, qos=1)
        await asyncio.sleep(10)


asyncio.run(main())
