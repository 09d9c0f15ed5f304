# Host stand-ins for what the firmware gets from MicroPython's ports, for tests under
# node (run.mjs): a UDP socket and a UART, both backed by the `hostio` module, which
# node bridges to a real UDP socket and to a real pseudo-terminal. Only the hardware
# is stood in for: the client library (mqttsn.py, uframe.py) runs unchanged.
import binascii

import hostio


class HostSocket:
    """What mqttsn.UDPTransport uses of a non-blocking socket."""

    def sendto(self, data, address):
        hostio.udp_send(binascii.hexlify(data).decode(), address[0], address[1])

    def recvfrom(self, size):
        got = hostio.udp_take()
        if not got:
            raise OSError(11)  # EAGAIN: nothing waiting
        data, host, port = got.split(" ")
        return binascii.unhexlify(data)[:size], (host, int(port))


class HostUART:
    """What mqttsn.UARTTransport uses of machine.UART."""

    def __init__(self):
        self.pending = b""

    def write(self, data):
        hostio.pty_write(binascii.hexlify(data).decode())
        return len(data)

    def any(self):
        got = hostio.pty_take()
        if got:
            self.pending += binascii.unhexlify(got)
        return len(self.pending)

    def read(self, size):
        out = self.pending[:size]
        self.pending = self.pending[size:]
        return out
