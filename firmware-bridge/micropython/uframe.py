# MQTT-SN over a UART: COBS frames with a CRC-16 (firmware-bridge/UART.md).
#
# frame = COBS(message + CRC-16/CCITT-FALSE(message), big-endian) + 0x00
#
# Runs on MicroPython (no crc_hqx in its binascii, hence the table-free CRC) and on
# CPython. The gateway's own implementation is gateway/mqttsn/uart.py; both are held to
# the vectors in firmware-bridge/vectors/uart.json.


def crc16(data, crc=0xFFFF):
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            if crc & 0x8000:
                crc = ((crc << 1) ^ 0x1021) & 0xFFFF
            else:
                crc = (crc << 1) & 0xFFFF
    return crc


def cobs_encode(data):
    out = bytearray(b"\x00")
    code_at = 0
    code = 1
    last = len(data) - 1
    for i in range(len(data)):
        b = data[i]
        if b == 0:
            out[code_at] = code
            code_at = len(out)
            out.append(0)
            code = 1
            continue
        out.append(b)
        code += 1
        if code == 0xFF and i < last:
            out[code_at] = code
            code_at = len(out)
            out.append(0)
            code = 1
    out[code_at] = code
    return out


def cobs_decode(data):
    """The decoded bytes, or None when ``data`` is not valid COBS."""
    out = bytearray()
    i = 0
    end = len(data)
    while i < end:
        code = data[i]
        if code == 0 or i + code > end:
            return None
        for j in range(i + 1, i + code):
            if data[j] == 0:
                return None
        out.extend(data[i + 1 : i + code])
        i += code
        if code < 0xFF and i < end:
            out.append(0)
    return out


def encode_frame(message):
    crc = crc16(message)
    body = bytearray(message)
    body.append(crc >> 8)
    body.append(crc & 0xFF)
    frame = cobs_encode(body)
    frame.append(0)
    return bytes(frame)


class Deframer:
    """Bytes in, messages out. Bad frames are counted in ``errors`` and skipped; a frame
    growing past ``limit`` octets is dropped and everything up to the next 0x00 skipped,
    so at most ``limit`` octets are ever buffered."""

    def __init__(self, max_message=256):
        body = max_message + 2
        self.limit = body + body // 254 + 1
        self.buf = bytearray()
        self.skipping = False
        self.errors = 0

    def reset(self):
        self.buf = bytearray()
        self.skipping = False

    def feed(self, data, out):
        """Append every complete message in ``data`` to the list ``out``."""
        for b in data:
            if b != 0:
                if self.skipping:
                    continue
                if len(self.buf) >= self.limit:
                    self.errors += 1
                    self.buf = bytearray()
                    self.skipping = True
                    continue
                self.buf.append(b)
                continue
            if self.skipping:
                self.skipping = False
                continue
            if not self.buf:
                continue  # idle delimiter
            body = cobs_decode(self.buf)
            self.buf = bytearray()
            if body is None or len(body) <= 2:
                self.errors += 1
                continue
            message = bytes(body[:-2])
            if crc16(message) != (body[-2] << 8) | body[-1]:
                self.errors += 1
                continue
            out.append(message)
