# A small BME280 (temperature, humidity, pressure) reader over I2C for MicroPython.
# Compensation as in the Bosch BME280 datasheet (BST-BME280-DS002), section 4.2.3 and
# appendix 8.1 (floating point). Forced mode: one measurement per read(), then the
# sensor sleeps (about 0.1 uA), which suits battery devices.
import struct
import time


class BME280:
    def __init__(self, i2c, address=0x76):
        self.i2c = i2c
        self.address = address
        if self._read(0xD0, 1)[0] != 0x60:
            raise OSError("no BME280 at 0x%02x" % address)
        t = struct.unpack("<HhhHhhhhhhhh", self._read(0x88, 24))
        self.t1, self.t2, self.t3 = t[0], t[1], t[2]
        self.p = t[3:]
        h1 = self._read(0xA1, 1)[0]
        e = self._read(0xE1, 7)
        self.h1 = h1
        self.h2 = struct.unpack("<h", e[0:2])[0]
        self.h3 = e[2]
        self.h4 = (e[3] << 4) | (e[4] & 0x0F)
        if self.h4 & 0x800:
            self.h4 -= 0x1000
        self.h5 = (e[5] << 4) | (e[4] >> 4)
        if self.h5 & 0x800:
            self.h5 -= 0x1000
        self.h6 = e[6] - 256 if e[6] > 127 else e[6]
        self._write(0xF2, 0x01)  # humidity oversampling x1

    def _read(self, register, n):
        return self.i2c.readfrom_mem(self.address, register, n)

    def _write(self, register, value):
        self.i2c.writeto_mem(self.address, register, bytes((value,)))

    def read(self):
        """(temperature in degC, relative humidity in %, pressure in hPa)."""
        self._write(0xF4, 0x25)  # temperature and pressure x1, forced mode
        for _ in range(20):
            time.sleep_ms(2)
            if not self._read(0xF3, 1)[0] & 0x08:
                break
        d = self._read(0xF7, 8)
        adc_p = (d[0] << 12) | (d[1] << 4) | (d[2] >> 4)
        adc_t = (d[3] << 12) | (d[4] << 4) | (d[5] >> 4)
        adc_h = (d[6] << 8) | d[7]
        v1 = (adc_t / 16384.0 - self.t1 / 1024.0) * self.t2
        v2 = (adc_t / 131072.0 - self.t1 / 8192.0) ** 2 * self.t3
        t_fine = v1 + v2
        temperature = t_fine / 5120.0
        p1, p2, p3, p4, p5, p6, p7, p8, p9 = self.p
        v1 = t_fine / 2.0 - 64000.0
        v2 = v1 * v1 * p6 / 32768.0 + v1 * p5 * 2.0
        v2 = v2 / 4.0 + p4 * 65536.0
        v1 = (p3 * v1 * v1 / 524288.0 + p2 * v1) / 524288.0
        v1 = (1.0 + v1 / 32768.0) * p1
        pressure = 0.0
        if v1:
            pressure = 1048576.0 - adc_p
            pressure = (pressure - v2 / 4096.0) * 6250.0 / v1
            v1 = p9 * pressure * pressure / 2147483648.0
            v2 = pressure * p8 / 32768.0
            pressure = pressure + (v1 + v2 + p7) / 16.0
        h = t_fine - 76800.0
        h = (adc_h - (self.h4 * 64.0 + self.h5 / 16384.0 * h)) * (
            self.h2 / 65536.0 * (1.0 + self.h6 / 67108864.0 * h * (1.0 + self.h3 / 67108864.0 * h))
        )
        h = h * (1.0 - self.h1 * h / 524288.0)
        humidity = min(100.0, max(0.0, h))
        return temperature, humidity, pressure / 100.0
