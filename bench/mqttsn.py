"""``python -m bench.mqttsn`` (``make bench-mqttsn``): the firmware bridge under load.

One Ledge process serves MQTT on TCP and MQTT-SN on UDP (pinned to one core; the load
generator, one thread with non-blocking sockets, runs on the other). In one run:

- **QoS 0 PUBLISH/s over UDP** from one MQTT-SN publisher through Ledge to one MQTT
  subscriber, beside **the same load over MQTT/TCP** (an MQTT publisher), rounds
  alternating; the ratio is the figure. Both publishers keep at most ``WINDOW``
  messages between sent and received, so neither measures what the kernel dropped.
- **QoS 1 PUBLISH/s** the same way: each PUBLISH acknowledged to its publisher (the
  subscriber takes QoS 0, so the figure is the publishing side's flow); UDP beside TCP.
- **RSS per idle MQTT-SN client**: 1,000 clients connect and subscribe to one topic
  each; the gateway's RSS before and after, per client (1,000 idle MQTT clients on TCP
  beside it, the anchor).
- **Soak**: 1,000 clients in sleep cycles for ``--soak`` seconds (600 by default):
  each sleeps, is sent QoS 1 messages while asleep (by an MQTT publisher), wakes with
  PINGREQ, receives and acknowledges them, publishes one QoS 1 reading, sleeps again.
  Every message Ledge acknowledged -- to the MQTT publisher, to a device -- must
  arrive exactly where it was going; RSS is sampled all along.

Figures depend on the machine: compare ratios, and run on a quiet one.
"""

from __future__ import annotations

import argparse
import random
import selectors
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import mqtt
from bench.procs import BenchError, Pinning, free_port, kill_all, raise_nofile, rss_kib
from gateway.mqttsn import packets as sn
from gateway.mqttsn.codec import decode
from gateway.mqttsn.encoding import encode, encode_publish

WINDOW = 200
#: Soak: downstream messages per device per second.
DOWN_PER_CLIENT_S = 1.0
PAYLOAD = b"x" * 32


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Ledge:
    """``ledge run`` with MQTT and MQTT-SN on free loopback ports."""

    def __init__(self, workdir: Path, pinning: Pinning, extra: str = "") -> None:
        self.mqtt_port = free_port()
        self.sn_port = free_udp_port()
        conf = workdir / "ledge-mqttsn.toml"
        conf.write_text(
            f"[[listeners]]\nport = {self.mqtt_port}\n"
            "[broker]\nmax_connections = 4096\nsys_interval = 0\n"
            "[mqttsn]\nmax_clients = 4096\nmax_connecting = 4096\n"
            f"{extra}\n"
            f"[[mqttsn.udp]]\nport = {self.sn_port}\n"
        )
        import subprocess

        self.log = (workdir / "ledge-mqttsn.log").open("wb")
        cmd = [sys.executable, "-m", "gateway", "run", "--config", str(conf)]
        self.proc = subprocess.Popen(
            [*pinning.broker_prefix(16384), *cmd, "--log-level", "warning"],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not _tcp_open(self.mqtt_port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(
                    f"ledge did not start: {(workdir / 'ledge-mqttsn.log').read_text()}"
                )
            time.sleep(0.05)

    @property
    def rss(self) -> int:
        return rss_kib(self.proc.pid) or 0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except Exception:
            self.proc.kill()
        self.log.close()


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------- small clients


class MqttClient:
    """A blocking-connect, then non-blocking MQTT 3.1.1 client (bench.mqtt codec)."""

    def __init__(self, port: int, client_id: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(mqtt.connect(client_id))
        self.buf = b""
        self._read_until(lambda: len(self.buf) >= 4)  # CONNACK
        self.buf = self.buf[4:]
        self.sock.setblocking(False)

    def _read_until(self, done: object) -> None:
        while not done():  # type: ignore[operator]
            self.buf += self.sock.recv(65536)

    def subscribe(self, topic_filter: str, qos: int) -> None:
        self.sock.setblocking(True)
        self.sock.sendall(mqtt.subscribe(1, [(topic_filter, qos)]))
        self._read_until(lambda: len(self.buf) >= 5)  # SUBACK
        self.buf = self.buf[5:]
        self.sock.setblocking(False)

    def frames(self) -> list[tuple[int, bytes]]:
        """Complete frames received so far: (first byte, body)."""
        try:
            while True:
                chunk = self.sock.recv(262144)
                if not chunk:
                    break
                self.buf += chunk
        except BlockingIOError:
            pass
        out = []
        pos = 0
        for first, start, end in mqtt.frames(self.buf):
            out.append((first, self.buf[start:end]))
            pos = end
        self.buf = self.buf[pos:]
        return out

    def close(self) -> None:
        self.sock.close()


class SnClient:
    """An MQTT-SN client on its own UDP socket (the project's codec)."""

    def __init__(self, port: int, client_id: str, keepalive: int = 600, host: str = "") -> None:
        self.gw = ("127.0.0.1", port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.bind((host or "127.0.0.1", 0))
        self.client_id = client_id
        self.keepalive = keepalive
        self.msg_id = 0

    def send(self, packet: sn.Packet) -> None:
        self.sock.sendto(encode(packet), self.gw)

    def request(self, packet: sn.Packet, kind: type, timeout: float = 10.0) -> sn.Packet:
        self.sock.settimeout(1.0)
        deadline = time.monotonic() + timeout
        self.send(packet)
        while time.monotonic() < deadline:
            try:
                got = decode(self.sock.recv(65536))
            except TimeoutError:
                self.send(packet)
                continue
            if isinstance(got, kind):
                return got
        raise BenchError(f"{self.client_id}: no {kind.__name__}")

    def connect(self, timeout: float = 30.0) -> None:
        """CONNECT; on "rejected: congestion" (the gateway's CONNECT rates) try again a
        little later, as a device does."""
        deadline = time.monotonic() + timeout
        while True:
            ack = self.request(sn.Connect(self.client_id, self.keepalive), sn.ConnAck)
            assert isinstance(ack, sn.ConnAck), ack
            if ack.return_code != sn.ReturnCode.CONGESTION or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if ack.return_code != 0:
            raise BenchError(f"{self.client_id}: CONNACK {ack.return_code}")

    def next_id(self) -> int:
        self.msg_id = self.msg_id % 0xFFFF + 1
        return self.msg_id

    def register(self, topic: str) -> int:
        ack = self.request(sn.Register(0, self.next_id(), topic), sn.RegAck)
        assert isinstance(ack, sn.RegAck) and ack.return_code == 0, ack
        return ack.topic_id

    def subscribe(self, topic: str, qos: int) -> None:
        ack = self.request(sn.Subscribe(self.next_id(), topic, qos), sn.SubAck)
        assert isinstance(ack, sn.SubAck) and ack.return_code == 0, ack


# ---------------------------------------------------------------------- throughput


@dataclass
class Rate:
    per_s: list[float] = field(default_factory=list)
    lost: int = 0

    def add(self, result: tuple[float, int]) -> None:
        self.per_s.append(result[0])
        self.lost += result[1]

    @property
    def median(self) -> float:
        return statistics.median(self.per_s) if self.per_s else 0.0


def _pump(
    send_one: object, sub: MqttClient, seconds: float, acks: object | None = None
) -> tuple[float, int]:
    """Send through ``send_one()`` keeping at most WINDOW in flight; returns (PUBLISH/s
    received, messages lost). A window that stops moving for a second is written off as
    lost (UDP may drop; a QoS 0 message is not resent), so the run goes on."""
    sent = received = lost = 0
    start = time.monotonic()
    end = start + seconds
    progress = start
    while True:
        now = time.monotonic()
        if now >= end:
            break
        while sent - received - lost < WINDOW:
            send_one()  # type: ignore[operator]
            sent += 1
        if acks is not None:
            acks()  # type: ignore[operator]
        got = sum(1 for first, _ in sub.frames() if first >> 4 == 3)
        if got:
            received += got
            progress = now
        elif now - progress > 1.0:
            lost += sent - received - lost
            progress = now
    deadline = time.monotonic() + 3
    while received + lost < sent and time.monotonic() < deadline:
        if acks is not None:
            acks()  # type: ignore[operator]
        received += sum(1 for first, _ in sub.frames() if first >> 4 == 3)
    lost = sent - received
    return received / (time.monotonic() - start), lost


def throughput(ledge: Ledge, qos: int, rounds: int, seconds: float) -> tuple[Rate, Rate]:
    """(MQTT-SN over UDP, MQTT over TCP) PUBLISH/s at ``qos``, alternating rounds."""
    udp, tcp = Rate(), Rate()
    sub = MqttClient(ledge.mqtt_port, f"sub-q{qos}")
    # The subscriber takes QoS 0: the figure is the publisher's QoS flow through Ledge.
    sub.subscribe(f"bench/q{qos}/#", 0)
    for r in range(rounds):
        # --- MQTT-SN publisher on UDP
        dev = SnClient(ledge.sn_port, f"snpub-q{qos}-{r}")
        dev.connect()
        tid = dev.register(f"bench/q{qos}/sn")
        dev.sock.setblocking(False)
        ids = [0]

        def send_sn(dev: SnClient = dev, tid: int = tid, ids: list[int] = ids) -> None:
            mid = 0
            if qos:
                ids[0] = ids[0] % 0xFFFF + 1
                mid = ids[0]
            dev.sock.sendto(encode_publish(tid, mid, PAYLOAD, qos), dev.gw)

        def drain_sn(dev: SnClient = dev) -> None:
            try:
                while True:
                    dev.sock.recv(65536)  # PUBACKs
            except BlockingIOError:
                pass

        udp.add(_pump(send_sn, sub, seconds, drain_sn if qos else None))
        dev.sock.close()
        # --- MQTT publisher on TCP
        pub = MqttClient(ledge.mqtt_port, f"tcppub-q{qos}-{r}")
        head = mqtt.publish(f"bench/q{qos}/tcp", PAYLOAD, qos, 1)
        pids = [0]

        def send_tcp(pub: MqttClient = pub, head: bytes = head, pids: list[int] = pids) -> None:
            if qos:
                pids[0] = pids[0] % 0xFFFF + 1
                parts = mqtt.publish_parts(f"bench/q{qos}/tcp", PAYLOAD, qos)
                data = parts[0] + pids[0].to_bytes(2, "big") + parts[1]
            else:
                data = head
            pub.sock.sendall(data)

        def drain_tcp(pub: MqttClient = pub) -> None:
            pub.frames()

        tcp.add(_pump(send_tcp, sub, seconds, drain_tcp if qos else None))
        pub.close()
    sub.close()
    return udp, tcp


# ---------------------------------------------------------------------- memory


def device_host(i: int) -> str:
    """The loopback address of device ``i``: devices sit on many hosts, ten to one
    address, as a LAN's devices (and the gateway's per-address limits) expect."""
    return f"127.10.{i // 2500}.{2 + i // 10 % 250}"


def idle_rss(ledge: Ledge, clients: int) -> tuple[float, float]:
    """KiB per idle client: (MQTT-SN on UDP, MQTT on TCP)."""
    before = _settled_rss(ledge)
    devices = []
    for i in range(clients):
        d = SnClient(ledge.sn_port, f"idle-sn-{i}", host=device_host(i))
        d.connect()
        d.subscribe(f"idle/sn/{i}", 1)
        devices.append(d)
    after_sn = _settled_rss(ledge)
    tcp = []
    for i in range(clients):
        c = MqttClient(ledge.mqtt_port, f"idle-tcp-{i}")
        c.subscribe(f"idle/tcp/{i}", 1)
        tcp.append(c)
    after_tcp = _settled_rss(ledge)
    for d in devices:
        d.send(sn.Disconnect())
        d.sock.close()
    for c in tcp:
        c.close()
    return (after_sn - before) / clients, (after_tcp - after_sn) / clients


def _settled_rss(ledge: Ledge) -> int:
    time.sleep(1.0)  # a bench, not a test: let the allocator settle before reading
    return ledge.rss


# ---------------------------------------------------------------------- soak


@dataclass
class SoakResult:
    clients: int
    seconds: float
    cycles: int = 0
    down_acknowledged: int = 0
    down_received: int = 0
    down_duplicates: int = 0
    up_acknowledged: int = 0
    up_received: int = 0
    rss_kib: list[int] = field(default_factory=list)

    @property
    def lost(self) -> int:
        return (self.down_acknowledged - self.down_received) + (
            self.up_acknowledged - self.up_received
        )


def soak(ledge: Ledge, clients: int, seconds: float, sleep_s: float = 5.0) -> SoakResult:
    """Sleep cycles for ``clients`` devices; counts what was acknowledged and arrived."""
    result = SoakResult(clients, seconds)
    rng = random.Random(7)
    sel = selectors.DefaultSelector()
    devices: list[SnClient] = []
    for i in range(clients):
        d = SnClient(ledge.sn_port, f"soak-{i}", keepalive=60, host=device_host(i))
        d.connect()
        d.subscribe(f"soak/down/{i}", 1)
        d.up_topic = d.register(f"soak/up/{i}")  # type: ignore[attr-defined]
        d.sock.setblocking(False)
        sel.register(d.sock, selectors.EVENT_READ, d)
        devices.append(d)
    pub = MqttClient(ledge.mqtt_port, "soak-pub")
    watch = MqttClient(ledge.mqtt_port, "soak-watch")
    watch.subscribe("soak/up/#", 1)
    state = {d.client_id: "awake" for d in devices}
    wake_at = {d.client_id: 0.0 for d in devices}
    pending_down: dict[int, int] = {}  # MQTT packet id -> device index
    seen_down: set[tuple[int, int]] = set()
    up_pending: dict[tuple[str, int], bytes] = {}
    next_pid = 0
    seq = 0
    start = time.monotonic()
    end = start + seconds
    last_rss = 0.0
    last_wake_scan = 0.0

    def serve(timeout: float) -> None:
        """Handle what the gateway sent to devices, as each device would."""
        for key, _ in sel.select(timeout=timeout):
            d = key.data
            try:
                while True:
                    msg = decode(d.sock.recv(65536))
                    _device_event(
                        d, msg, state, wake_at, result, seen_down, up_pending, sleep_s, rng
                    )
            except BlockingIOError:
                pass

    for d in devices:  # everyone goes to sleep at a random phase
        d.send(sn.Disconnect(int(sleep_s * 3)))
        state[d.client_id] = "sleeping"
        wake_at[d.client_id] = start + rng.uniform(0, sleep_s)
    while True:
        now = time.monotonic()
        if now - last_rss >= 1.0:
            result.rss_kib.append(ledge.rss)
            last_rss = now
        if now < end:
            # Downstream: QoS 1 messages to random devices, one per device per second on
            # average, so a sleep cycle buffers a few (the sleep buffer holds 100).
            while seq < (now - start) * clients * DOWN_PER_CLIENT_S:
                i = rng.randrange(clients)
                seq += 1
                next_pid = next_pid % 0xFFFF + 1
                if next_pid in pending_down:
                    break
                pending_down[next_pid] = i
                pub.sock.sendall(mqtt.publish(f"soak/down/{i}", f"{seq}".encode(), 1, next_pid))
        for first, body in pub.frames():
            if first >> 4 == 4:  # PUBACK from Ledge: acknowledged
                pid = int.from_bytes(body[:2], "big")
                if pending_down.pop(pid, None) is not None:
                    result.down_acknowledged += 1
        if now - last_wake_scan >= 0.01:
            # Devices keep their sleep cycles until the end (one that stopped waking
            # would be lost, rightly, with what was kept for it).
            last_wake_scan = now
            for d in devices:
                cid = d.client_id
                if state[cid] == "sleeping" and now >= wake_at[cid]:
                    d.send(sn.PingReq(cid))  # wake: buffered messages, then PINGRESP
                    state[cid] = "waking"
                    wake_at[cid] = now + 2.0  # resend the wake-up if nothing comes
                elif state[cid] == "waking" and now >= wake_at[cid]:
                    d.send(sn.PingReq(cid))
                    wake_at[cid] = now + 2.0
        serve(0.002)
        _collect_upstream(watch, up_pending, result)
        if now >= end + sleep_s * 2 + 2:
            break
    # Last round: wake every device once more and collect the rest.
    final_deadline = time.monotonic() + 20
    for d in devices:
        d.send(sn.PingReq(d.client_id))
        state[d.client_id] = "final"
    while time.monotonic() < final_deadline and (
        result.down_received + result.down_duplicates < result.down_acknowledged
        or result.up_received < result.up_acknowledged
    ):
        serve(0.05)
        _collect_upstream(watch, up_pending, result)
    result.seconds = seconds
    result.rss_kib.append(ledge.rss)
    for d in devices:
        d.sock.close()
    pub.close()
    watch.close()
    return result


def _collect_upstream(
    watch: MqttClient, up_pending: dict[tuple[str, int], bytes], result: SoakResult
) -> None:
    """Count (and acknowledge) the devices' readings at the MQTT subscriber."""
    for first, body in watch.frames():
        if first >> 4 == 3:
            tlen = int.from_bytes(body[:2], "big")
            topic = body[2 : 2 + tlen].decode()
            pid = int.from_bytes(body[2 + tlen : 4 + tlen], "big")
            watch.sock.sendall(mqtt.puback(pid))
            payload = body[4 + tlen :]
            if up_pending.pop((topic, int(payload.split(b":")[0])), None) is not None:
                result.up_received += 1


def _device_event(
    d: SnClient,
    msg: sn.Packet,
    state: dict[str, str],
    wake_at: dict[str, float],
    result: SoakResult,
    seen: set[tuple[int, int]],
    up_pending: dict[tuple[str, int], bytes],
    sleep_s: float,
    rng: random.Random,
) -> None:
    cid = d.client_id
    index = int(cid.rsplit("-", 1)[1])
    if isinstance(msg, sn.Publish):
        if msg.qos == 1:
            d.send(sn.PubAck(msg.topic_id, msg.msg_id))
        key = (index, int(msg.data))
        if key in seen:
            result.down_duplicates += 1
        else:
            seen.add(key)
            result.down_received += 1
    elif isinstance(msg, sn.Register):
        d.send(sn.RegAck(msg.topic_id, msg.msg_id))
    elif isinstance(msg, sn.PingResp) and state[cid] in ("waking", "final"):
        if state[cid] == "final":
            return
        # Awake and served: publish one reading, then sleep again.
        result.cycles += 1
        mid = d.next_id()
        d.send(sn.Publish(d.up_topic, mid, f"{mid}:{result.cycles}".encode(), 1))  # type: ignore[attr-defined]
        up_pending[(f"soak/up/{index}", mid)] = b""
        state[cid] = "publishing"
    elif isinstance(msg, sn.PubAck) and state[cid] == "publishing":
        if msg.return_code == 0:
            result.up_acknowledged += 1
        d.send(sn.Disconnect(int(sleep_s * 3)))
        state[cid] = "sleeping"
        wake_at[cid] = time.monotonic() + sleep_s * rng.uniform(0.8, 1.2)


# ---------------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mqttsn", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput round")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--soak", type=float, default=600.0, help="soak seconds (0: none)")
    args = parser.parse_args(argv)
    raise_nofile(16384)
    pinning = Pinning()
    if pinning.note:
        print(f"note: {pinning.note}")
    with tempfile.TemporaryDirectory(prefix="ledge-bench-mqttsn-") as tmp:
        ledge = Ledge(Path(tmp), pinning)
        pinning.pin_self()
        try:
            print(f"ledge idle RSS with [mqttsn] on: {ledge.rss} KiB")
            rows = []
            for qos in (0, 1):
                udp, tcp = throughput(ledge, qos, args.rounds, args.seconds)
                rows.append((qos, udp, tcp))
            print(
                "\n| PUBLISH/s, one publisher -> Ledge -> one subscriber "
                "| MQTT-SN/UDP | MQTT/TCP | ratio | lost UDP / TCP |"
            )
            print("|---|---|---|---|---|")
            for qos, u, t in rows:
                print(
                    f"| QoS {qos} (median of {args.rounds} x {args.seconds:g} s) "
                    f"| {u.median:,.0f} | {t.median:,.0f} | {u.median / t.median:.2f} "
                    f"| {u.lost} / {t.lost} |"
                )
            sn_kib, tcp_kib = idle_rss(ledge, args.clients)
            print(f"\n| RSS per idle client, {args.clients:,} clients | MQTT-SN/UDP | MQTT/TCP |")
            print("|---|---|---|")
            print(f"| KiB (one subscription each) | {sn_kib:.2f} | {tcp_kib:.2f} |")
            if args.soak > 0:
                r = soak(ledge, args.clients, args.soak)
                print(
                    f"\nsoak: {r.clients:,} sleeping clients for {r.seconds:g} s, "
                    f"{r.cycles:,} wake cycles"
                )
                print(
                    f"  downstream QoS 1: {r.down_acknowledged:,} acknowledged by Ledge, "
                    f"{r.down_received:,} delivered once (+{r.down_duplicates} duplicates)"
                )
                print(
                    f"  upstream QoS 1:   {r.up_acknowledged:,} acknowledged by Ledge, "
                    f"{r.up_received:,} received by the MQTT subscriber"
                )
                print(f"  lost: {r.lost}")
                rss = r.rss_kib
                if rss:
                    tenth = max(1, len(rss) // 10)
                    print(
                        f"  RSS KiB: first 10% median {statistics.median(rss[:tenth]):,.0f}, "
                        f"last 10% median {statistics.median(rss[-tenth:]):,.0f}, "
                        f"max {max(rss):,}"
                    )
                    step = max(1, len(rss) // 10)
                    print(
                        "  RSS KiB every tenth of the soak: "
                        + ", ".join(f"{v:,}" for v in rss[::step])
                    )
        finally:
            ledge.stop()
            kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
