"""The cloud bridge end to end: ``ledge run`` bridged to Debian's Mosquitto (the cloud),
real paho clients on both sides, the uplink broken and Ledge killed on purpose.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from drivers.model import Health, health_from_message
from gateway.cli.bridge import collect
from tests.support.clients import Paho, Received
from tests.support.procs import REPO, LedgeProcess, MosquittoProcess, dead_port, free_port
from tests.support.wait import wait_for


@dataclass
class Cloud:
    """A Mosquitto standing in for the cloud broker, restartable on its port."""

    workdir: Path
    extra: str = ""
    port: int = 0
    proc: MosquittoProcess | None = None

    def start(self) -> Cloud:
        self.proc = MosquittoProcess(self.workdir, self.extra).start(self.port or None)
        self.port = self.proc.port
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[Cloud]:
    c = Cloud(tmp_path)
    yield c
    c.stop()


def bridge_config(
    tmp_path: Path,
    cloud_port: int,
    rules: str,
    bridge: str = "",
    top: str = "",
    gateway: str = "gw1",
    name: str = "cloud",
) -> Path:
    path = tmp_path / f"{gateway}.toml"
    path.write_text(
        f"{top}\n"
        "[broker]\nsys_interval = 0.2\n"
        f'[gateway]\nid = "{gateway}"\n'
        "[[bridges]]\n"
        f'name = "{name}"\n'
        f'address = "127.0.0.1:{cloud_port}"\n'
        "reconnect_min = 0.05\nreconnect_max = 0.5\n"
        f"{bridge}\n{rules}\n"
    )
    return path


def rule(filter: str, **options: Any) -> str:
    text = f'[[bridges.rules]]\nfilter = "{filter}"\n'
    for key, value in options.items():
        text += f"{key} = {value!r}\n".replace("'", '"')
    return text


def marks(m: Received) -> dict[str, str]:
    return dict(getattr(m.properties, "UserProperty", []) or [])


def bridge_values(proc: LedgeProcess, name: str = "cloud") -> dict[str, str]:
    prefix = f"$SYS/broker/bridge/{name}/"
    return {k.removeprefix(prefix): v for k, v in collect("127.0.0.1", proc.port).items()}


def wait_bridge(proc: LedgeProcess, key: str, value: str, timeout: float = 10.0) -> None:
    wait_for(
        lambda: bridge_values(proc).get(key) == value,
        timeout,
        f"bridge {key} = {value}",
    )


# ---------------------------------------------------------------------- (a) mirroring


def test_branches_are_mirrored_with_remapping_and_marks(tmp_path: Path, cloud: Cloud) -> None:
    cloud.start()
    rules = (
        rule("sensors/#", local_prefix="ledge/gw1/", remote_prefix="site1/gw1/")  # replace
        + rule("alerts/+", remote_prefix="site1/", qos=0)  # add
        + rule("#", local_prefix="export/", retain="strip")  # strip
    )
    proc = LedgeProcess(config=bridge_config(tmp_path, cloud.port, rules)).start()
    try:
        proc.wait_log("bridge cloud: connected to")
        up = Paho(cloud.port, "cloud-watch").connect()
        up.subscribe("#", 1, retainAsPublished=True)
        pub = Paho(proc.port, "local-pub").connect()
        props = Properties(PacketTypes.PUBLISH)
        props.UserProperty = ("site", "north")
        pub.publish("ledge/gw1/sensors/t", b"21.5", 1, properties=props)
        pub.publish("alerts/boiler", b"hot", 1, retain=True)
        pub.publish("export/a/b", b"kept", 1, retain=True)
        pub.publish("ledge/gw2/sensors/t", b"not ours", 1)  # matches no rule
        pub.publish("export/z", b"last", 1)
        got = {m.topic: m for m in up.wait_messages(4)}
        assert got["site1/gw1/sensors/t"].payload == b"21.5"
        assert got["site1/alerts/boiler"].qos == 0  # the rule caps QoS
        assert got["site1/alerts/boiler"].retain  # kept
        assert got["a/b"].payload == b"kept" and not got["a/b"].retain  # stripped
        assert "z" in got and "ledge/gw2/sensors/t" not in got and len(got) == 4
        first = marks(got["site1/gw1/sensors/t"])
        assert first["site"] == "north"  # the publisher's own user property travels
        assert first["ledge-gateway"] == "gw1"
        seqs = [int(marks(got[t])["ledge-seq"]) for t in ("site1/gw1/sensors/t", "a/b", "z")]
        assert seqs == sorted(seqs) and len(set(seqs)) == 3
        wait_bridge(proc, "acknowledged", "4")
        values = bridge_values(proc)
        assert values["state"] == "connected" and values["queued"] == "0"
        assert values["sent"] == "4" and values["dropped"] == "0"
        up.disconnect()
        pub.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- (b) outage


def test_an_uplink_outage_loses_nothing_and_replays_in_order(tmp_path: Path, cloud: Cloud) -> None:
    cloud.extra = f"persistence true\npersistence_location {tmp_path}/\nuser root\n"
    cloud.start()
    config = bridge_config(tmp_path, cloud.port, rule("t/#", remote_prefix="up/"))
    proc = LedgeProcess("--data-dir", str(tmp_path / "data"), config=config).start()
    total = 600
    try:
        proc.wait_log("bridge cloud: connected to")
        up = Paho(cloud.port, "consumer").connect(clean=False, session_expiry=600)
        up.subscribe("up/#", 1)
        up.client.reconnect_delay_set(1, 1)
        pub = Paho(proc.port, "producer").connect()
        for i in range(total // 3):
            pub.publish("t/a", b"%d" % i, 1)
        up.wait_messages(total // 3, 10)
        cloud.stop()  # the uplink drops (Mosquitto keeps the consumer's session on disk)
        proc.wait_log("bridge cloud: lost 127.0.0.1")
        for i in range(total // 3, 2 * total // 3):
            pub.publish("t/a", b"%d" % i, 1)  # acknowledged locally, waiting in the outbox
        wait_bridge(proc, "queued", str(total // 3))
        cloud.start()  # back on the same port
        for i in range(2 * total // 3, total):
            pub.publish("t/a", b"%d" % i, 1)
        wait_for(
            lambda: len({m.payload for m in up.messages}) >= total, 20, "every message upstream"
        )
        got = list(up.messages)
        order = [int(m.payload) for m in got]
        firsts = list(dict.fromkeys(order))  # QoS 1 may repeat; first arrivals must be in order
        assert firsts == list(range(total))
        seqs = list(dict.fromkeys(int(marks(m)["ledge-seq"]) for m in got))
        assert seqs == sorted(seqs)
        wait_bridge(proc, "queued", "0")
        assert bridge_values(proc)["dropped"] == "0"
        up.disconnect()
        pub.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- (c) kill -9


def test_the_outbox_survives_kill_9_while_the_uplink_is_down(tmp_path: Path, cloud: Cloud) -> None:
    cloud.port = free_port()  # nothing listens there yet
    config = bridge_config(tmp_path, cloud.port, rule("t/#"))
    data = str(tmp_path / "data")
    proc = LedgeProcess("--data-dir", data, config=config).start()
    count = 300
    try:
        pub = Paho(proc.port, "producer").connect()
        for i in range(count):
            pub.publish("t/x", b"%d" % i, 1)  # each acknowledged: durable in the outbox
        pub.disconnect()
    finally:
        proc.kill()
    cloud.start()
    up = Paho(cloud.port, "consumer").connect()
    up.subscribe("t/#", 1)
    proc = LedgeProcess("--data-dir", data, config=config).start()
    try:
        proc.wait_log(rf"bridge cloud: connected to .*{count} message\(s\) waiting")
        got = up.wait_messages(count, 20)
        assert [int(m.payload) for m in got[:count]] == list(range(count))
        wait_bridge(proc, "queued", "0")
        up.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- (d) full outbox


@dataclass
class Publisher:
    """A paho 5.0 publisher that records every PUBACK reason code."""

    client: mqtt.Client
    codes: dict[int, int]

    @classmethod
    def connect(cls, port: int) -> Publisher:
        codes: dict[int, int] = {}
        client = mqtt.Client(CallbackAPIVersion.VERSION2, "full-pub", protocol=mqtt.MQTTv5)

        def on_publish(c: Any, u: Any, mid: int, rc: Any, props: Any) -> None:
            codes[mid] = rc.value

        client.on_publish = on_publish
        client.connect("127.0.0.1", port)
        client.loop_start()
        return cls(client, codes)

    def publish(self, topic: str, payload: bytes) -> int:
        info = self.client.publish(topic, payload, 1)
        wait_for(lambda: info.mid in self.codes, 5, f"PUBACK for {payload!r}")
        return self.codes[info.mid]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.mark.parametrize("policy", ["drop-oldest", "drop-newest", "refuse"])
def test_a_full_outbox_applies_its_policy_and_counts(
    tmp_path: Path, cloud: Cloud, policy: str
) -> None:
    """The cloud's consumer has subscribed (a persistent session, kept on disk) before
    the bridge can ever connect: whenever the bridge drains its outbox, every message
    is queued for the consumer, however fast the replay is."""
    cloud.extra = f"persistence true\npersistence_location {tmp_path}/\nuser root\n"
    cloud.start()
    first = Paho(cloud.port, "consumer").connect(clean=False, session_expiry=600)
    first.subscribe("t/#", 1)
    first.disconnect()
    cloud.stop()  # the uplink is down from the start
    config = bridge_config(
        tmp_path,
        cloud.port,
        rule("t/#"),
        bridge=f'outbox = {{ max_messages = 50, when_full = "{policy}" }}',
    )
    proc = LedgeProcess("--data-dir", str(tmp_path / "data"), config=config).start()
    try:
        pub = Publisher.connect(proc.port)
        codes = [pub.publish("t/x", b"%d" % i) for i in range(80)]
        pub.close()
        if policy == "refuse":
            assert codes == [0] * 50 + [0x97] * 30  # quota exceeded
            wait_bridge(proc, "refused", "30")
        else:
            assert codes == [0] * 80
            wait_bridge(proc, "dropped/full", "30")
        assert bridge_values(proc)["queued"] == "50"
        cloud.start()  # on the same port, with the consumer's session
        wait_bridge(proc, "queued", "0")
        up = Paho(cloud.port, "consumer").connect(clean=False, session_expiry=600)
        assert up.session_present
        got = [int(m.payload) for m in up.wait_messages(50)]
        expected = list(range(30, 80)) if policy == "drop-oldest" else list(range(50))
        assert got == expected
        values = bridge_values(proc)
        assert values["acknowledged"] == "50"
        assert int(values["dropped"]) == (0 if policy == "refuse" else 30)
        up.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- (e) inbound


def test_inbound_rules_deliver_cloud_commands_to_local_subscribers(
    tmp_path: Path, cloud: Cloud
) -> None:
    cloud.start()
    rules = rule("cmd/#", direction="in", local_prefix="local/", remote_prefix="devices/gw1/")
    rules += rule("state/#", direction="both")
    proc = LedgeProcess(config=bridge_config(tmp_path, cloud.port, rules)).start()
    try:
        proc.wait_log("bridge cloud: connected to")
        local = Paho(proc.port, "local-sub").connect()
        local.subscribe("local/#", 1)
        local.subscribe("state/#", 1)
        remote = Paho(cloud.port, "cloud-app").connect()
        remote.subscribe("state/#", 1)
        remote.publish("devices/gw1/cmd/reboot", b"now", 1)
        remote.publish("devices/gw2/cmd/reboot", b"not for us", 1)
        got = local.wait_messages(1)
        assert [(m.topic, m.payload) for m in got] == [("local/cmd/reboot", b"now")]
        assert marks(got[0])["ledge-gateway"] == "gw1"  # stamped as it came in
        # both ways, and nothing comes back the way it went
        remote.publish("state/from-cloud", b"c", 1)
        local.publish("state/from-gateway", b"g", 1)
        remote.publish("state/sentinel", b"s", 1)
        wait_for(
            lambda: any(m.topic == "state/sentinel" for m in local.messages),
            5,
            "the sentinel locally",
        )
        wait_for(
            lambda: any(m.topic == "state/from-gateway" for m in remote.messages),
            5,
            "the gateway's message upstream",
        )
        local_topics = [m.topic for m in local.messages]
        remote_topics = [m.topic for m in remote.messages]
        assert local_topics.count("state/from-cloud") == 1
        assert local_topics.count("state/from-gateway") == 1
        assert remote_topics.count("state/from-cloud") == 1
        assert remote_topics.count("state/from-gateway") == 1
        local.disconnect()
        remote.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- (f) mutual TLS


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate for gw1."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))  # fmt: skip
    for name, extra in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        ext = d / f"{name}.ext"
        ext.write_text(extra + "\n" if extra else "basicConstraints=CA:FALSE\n")
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "2",
                "-extfile", str(ext), "-out", str(d / f"{name}.pem"))  # fmt: skip
    for key in d.glob("*.key"):
        key.chmod(0o600)


def test_mutual_tls_to_the_upstream(tmp_path: Path, cloud: Cloud) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    make_certificates(certs)
    cloud.extra = (
        f"cafile {certs / 'ca.pem'}\ncertfile {certs / 'server.pem'}\n"
        f"keyfile {certs / 'server.key'}\nrequire_certificate true\n"
        "use_identity_as_username true\n"
        "user root\n"  # run as root it would switch users and lose access to the 0600 key
    )
    cloud.start()
    tls = (
        f'tls = {{ enabled = true, ca_file = "{certs / "ca.pem"}", '
        f'cert_file = "{certs / "client.pem"}", key_file = "{certs / "client.key"}" }}'
    )
    proc = LedgeProcess(config=bridge_config(tmp_path, cloud.port, rule("t/#"), tls)).start()
    try:
        proc.wait_log("bridge cloud: connected to", 10)
        # the cloud side: a local client of the same Mosquitto over TLS
        up = mqtt.Client(CallbackAPIVersion.VERSION2, "tls-watch", protocol=mqtt.MQTTv5)
        up.tls_set(str(certs / "ca.pem"), str(certs / "client.pem"), str(certs / "client.key"))
        received: list[bytes] = []
        up.on_message = lambda c, u, m: received.append(bytes(m.payload))
        up.connect("127.0.0.1", cloud.port)
        up.loop_start()
        wait_for(up.is_connected, 5, "TLS consumer connected")
        up.subscribe("t/#", 1)
        pub = Paho(proc.port, "local-pub").connect()
        pub.publish("t/x", b"over mutual TLS", 1)
        wait_for(lambda: received == [b"over mutual TLS"], 5, "the message upstream")
        up.disconnect()
        up.loop_stop()
        pub.disconnect()
    finally:
        assert proc.stop() == 0
    # without a client certificate the remote refuses us, and the log says so
    no_cert = f'tls = {{ enabled = true, ca_file = "{certs / "ca.pem"}" }}\nconnect_timeout = 3'
    config = bridge_config(tmp_path, cloud.port, rule("t/#"), no_cert, gateway="gw2")
    proc = LedgeProcess(config=config).start()
    try:
        line = proc.wait_log("bridge cloud: cannot connect to 127.0.0.1", 10)
        assert "retrying" in line
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- loops


@pytest.mark.parametrize("variant", ["5.0", "3.1.1", "3.1.1-envelope", "5.0-both-sides"])
def test_two_gateways_bridged_both_ways_never_loop(tmp_path: Path, variant: str) -> None:
    b = LedgeProcess(config=_plain(tmp_path, "b")).start()
    protocol = variant.split("-", maxsplit=1)[0]
    extra = f'protocol = "{protocol}"\n' + ("envelope = true\n" if "envelope" in variant else "")
    a_config = bridge_config(
        tmp_path, b.port, rule("x/#", direction="both"), extra, gateway="a", name="ab"
    )
    a = LedgeProcess(config=a_config).start()
    reverse: LedgeProcess | None = None
    try:
        a.wait_log("bridge ab: connected to")
        if variant == "5.0-both-sides":
            # b also bridges the same branch back to a: duplicates are possible, loops not
            b.stop()
            b_config = bridge_config(
                tmp_path, a.port, rule("x/#", direction="both"), gateway="b", name="ba"
            )
            reverse = b = LedgeProcess(port=b.port, config=b_config).start()
            b.wait_log("bridge ba: connected to")
            wait_for(lambda: a.log.count("bridge ab: connected to") >= 2, 10, "a to reconnect to b")
        on_a = Paho(a.port, "on-a").connect()
        on_a.subscribe("x/#", 1)
        on_b = Paho(b.port, "on-b").connect()
        on_b.subscribe("x/#", 1)
        on_a.publish("x/from-a", b"1", 1)
        on_b.publish("x/from-b", b"2", 1)
        for i in range(3):  # sentinels through both paths: earlier copies arrive first
            on_a.publish("x/sentinel-a", b"%d" % i, 1)
            on_b.publish("x/sentinel-b", b"%d" % i, 1)
        for sub in (on_a, on_b):

            def sentinels(s: Paho = sub) -> bool:
                return sum(m.topic.startswith("x/sentinel") for m in s.messages) >= 6

            wait_for(sentinels, 10, f"sentinels at {sub.client_id}")
        for sub in (on_a, on_b):
            topics = [m.topic for m in sub.messages]
            for topic in ("x/from-a", "x/from-b"):
                # one bridge both ways: exactly once. Two opposite bridges carrying the
                # same branch: a bounded number of copies (each marked), never a loop.
                limit = 1 if reverse is None else 3
                assert 1 <= topics.count(topic) <= limit, (sub.client_id, topics)
        if reverse is not None:
            # copies that came around are recognised by their marks and stopped
            loops = int(bridge_values(a, "ab").get("dropped/loops", "0"))
            loops += int(bridge_values(b, "ba").get("dropped/loops", "0"))
            assert loops > 0
        on_a.disconnect()
        on_b.disconnect()
    finally:
        assert a.stop() == 0
        assert b.stop() == 0


def _plain(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}-plain.toml"
    path.write_text(f'[broker]\nsys_interval = 0.2\n[gateway]\nid = "{name}"\n')
    return path


# ---------------------------------------------------------------------- pacing


def test_replay_honours_the_remotes_receive_maximum_and_the_rate_limit(
    tmp_path: Path, cloud: Cloud
) -> None:
    """100 messages wait in the outbox (written while the cloud was down, kept across a
    restart); the cloud's consumer is subscribed before the bridge connects, so the
    arrival times it sees are the replay's pace: never faster than ``rate_limit``."""
    rate = 40
    count = 100
    cloud.extra = "max_inflight_messages 5\n"
    cloud.port = free_port()
    config = bridge_config(tmp_path, cloud.port, rule("t/#"), f"rate_limit = {rate}")
    data = str(tmp_path / "data")
    proc = LedgeProcess("--data-dir", data, config=config).start()
    try:
        pub = Paho(proc.port, "producer").connect()
        for i in range(count):
            pub.publish("t/x", b"%d" % i, 1)
        pub.disconnect()
        wait_bridge(proc, "queued", str(count))
    finally:
        assert proc.stop() == 0
    cloud.start()
    up = Paho(cloud.port, "consumer").connect()
    up.subscribe("t/#", 1)
    proc = LedgeProcess("--data-dir", data, config=config).start()
    try:
        line = proc.wait_log("bridge cloud: connected to", 10)
        assert "receive maximum 5, window 5" in line
        # Mosquitto disconnects a client that exceeds its Receive Maximum (0x93): we never do
        got = up.wait_messages(count, 20)
        assert [int(m.payload) for m in got] == list(range(count))
        span = got[-1].at - got[0].at
        least = (count - 1) / rate  # the first goes at once, then one per 1/rate s
        assert span >= least * 0.9, f"{count} messages in {span:.2f} s: over {rate}/s"
        assert span < least * 4, f"{count} messages in {span:.2f} s: far below {rate}/s"
        wait_bridge(proc, "acknowledged", str(count))
        assert bridge_values(proc)["connects"] == "1"
        up.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- refusals


def test_a_message_the_remote_refuses_is_counted_dropped_and_never_retried(
    tmp_path: Path, cloud: Cloud
) -> None:
    """Mosquitto answers a PUBLISH its ACL denies with PUBACK 0x87 (MQTT 5.0)."""
    acl = tmp_path / "cloud.acl"
    acl.write_text("topic write up/ok/#\ntopic read #\n")
    cloud.extra = f"acl_file {acl}\nuser root\n"
    cloud.start()
    rules = rule("#", local_prefix="t/", remote_prefix="up/")
    proc = LedgeProcess(config=bridge_config(tmp_path, cloud.port, rules)).start()
    try:
        proc.wait_log("bridge cloud: connected to")
        up = Paho(cloud.port, "consumer").connect()
        up.subscribe("up/#", 1)
        pub = Paho(proc.port, "producer").connect()
        pub.publish("t/ok/1", b"1", 1)
        pub.publish("t/denied/1", b"2", 1)
        pub.publish("t/ok/2", b"3", 1)
        assert [m.payload for m in up.wait_messages(2)] == [b"1", b"3"]
        wait_bridge(proc, "dropped/rejected", "1")
        proc.wait_log(r"the remote refused the message on 'up/denied/1' \(reason code 0x87\)")
        wait_bridge(proc, "queued", "0")
        values = bridge_values(proc)
        assert values["sent"] == "3" and values["acknowledged"] == "3"
        assert values["dropped"] == "1"
        # Nothing was sent again meanwhile: one more message is the 4th ever sent.
        pub.publish("t/ok/3", b"4", 1)
        assert [m.payload for m in up.wait_messages(3)][-1] == b"4"
        wait_bridge(proc, "acknowledged", "4")
        assert bridge_values(proc)["sent"] == "4"
        assert proc.log.count("the remote refused") == 1
        up.disconnect()
        pub.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- QoS 0 bypass


def test_qos0_bypass_goes_up_only_while_connected_and_never_to_disk(
    tmp_path: Path, cloud: Cloud
) -> None:
    cloud.start()
    config = bridge_config(tmp_path, cloud.port, rule("t/#"), 'qos0 = "bypass"')
    proc = LedgeProcess("--data-dir", str(tmp_path / "data"), config=config).start()
    try:
        proc.wait_log("bridge cloud: connected to")
        up = Paho(cloud.port, "consumer").connect(clean=False, session_expiry=600)
        up.subscribe("t/#", 1)
        pub = Paho(proc.port, "producer").connect()
        pub.publish("t/live", b"q0-online", 0)
        assert [m.payload for m in up.wait_messages(1)] == [b"q0-online"]
        up.disconnect()
        cloud.stop()
        proc.wait_log("bridge cloud: lost 127.0.0.1")
        for i in range(5):
            pub.publish("t/offline", b"q0-%d" % i, 0)
        pub.publish("t/offline", b"q1-kept", 1)
        wait_bridge(proc, "dropped/qos 0 offline", "5")
        assert bridge_values(proc)["queued"] == "1"  # only the QoS 1 message waits
        db = sqlite3.connect(f"file:{tmp_path / 'data' / 'ledge.db'}?mode=ro", uri=True)
        try:
            assert db.execute("SELECT count(*) FROM outbox").fetchone() == (1,)
        finally:
            db.close()
        cloud.start()
        up = Paho(cloud.port, "consumer").connect(clean=False, session_expiry=600)
        up.subscribe("t/#", 1)
        wait_bridge(proc, "queued", "0")
        pub.publish("t/live", b"q0-back", 0)
        got = up.wait_messages(2)
        assert sorted(m.payload for m in got) == [b"q0-back", b"q1-kept"]
        pub.disconnect()
        up.disconnect()
    finally:
        assert proc.stop() == 0


# ---------------------------------------------------------------------- failover


def test_failover_through_addresses(tmp_path: Path, cloud: Cloud) -> None:
    """The first address has nobody listening: the bridge moves on to the next."""
    cloud.start()
    with dead_port() as dead:
        rules = rule("t/#")
        extra = f'addresses = ["127.0.0.1:{cloud.port}"]'
        proc = LedgeProcess(config=bridge_config(tmp_path, dead, rules, extra)).start()
        try:
            proc.wait_log(rf"bridge cloud: cannot connect to 127.0.0.1:{dead}")
            proc.wait_log(rf"bridge cloud: connected to 127.0.0.1:{cloud.port}", 15)
            assert bridge_values(proc)["address"] == f"127.0.0.1:{cloud.port}"
            up = Paho(cloud.port, "consumer").connect()
            up.subscribe("t/#", 1)
            pub = Paho(proc.port, "producer").connect()
            pub.publish("t/x", b"via the second address", 1)
            assert [m.payload for m in up.wait_messages(1)] == [b"via the second address"]
            up.disconnect()
            pub.disconnect()
        finally:
            assert proc.stop() == 0


# ---------------------------------------------------------------------- status will


def test_the_cloud_sees_the_gateways_status_online_and_offline(
    tmp_path: Path, cloud: Cloud
) -> None:
    """The gateway's status topic maps out through a rule: the bridge publishes
    ``online`` (retained) on connect and ``offline`` on a clean stop; after kill -9 the
    cloud publishes the bridge's will, ``offline``, retained."""
    cloud.start()
    rules = rule("gw1/status", local_prefix="ledge/", remote_prefix="site/")
    config = bridge_config(tmp_path, cloud.port, rules)
    watch = Paho(cloud.port, "status-watch").connect()
    watch.subscribe("site/gw1/status", 1)

    def statuses(count: int) -> list[tuple[bytes, bool]]:
        return [(m.payload, m.retain) for m in watch.wait_messages(count, 15)]

    proc = LedgeProcess(config=config).start()
    try:
        assert statuses(1) == [(b"online", False)]  # live delivery: retain flag cleared
    finally:
        assert proc.stop() == 0
    assert statuses(2)[1] == (b"offline", False)
    proc = LedgeProcess(config=config).start()
    try:
        assert statuses(3)[2] == (b"online", False)
    finally:
        proc.kill()  # no goodbye: only the will can tell the cloud
    assert statuses(4)[3] == (b"offline", False)
    late = Paho(cloud.port, "late-watch").connect()
    late.subscribe("site/gw1/status", 1)
    assert [(m.payload, m.retain) for m in late.wait_messages(1)] == [(b"offline", True)]
    late.disconnect()
    watch.disconnect()


# ---------------------------------------------------------------------- commands


def test_bridge_status_and_bridge_test_commands(tmp_path: Path, cloud: Cloud) -> None:
    cloud.start()
    config = bridge_config(
        tmp_path, cloud.port, rule("sensors/#", local_prefix="ledge/gw1/", remote_prefix="s1/")
    )
    proc = LedgeProcess(config=config).start()
    try:
        proc.wait_log("bridge cloud: connected to")
        out = _ledge("bridge", "status", "-c", str(config), "--broker", f"127.0.0.1:{proc.port}")
        assert out.returncode == 0, out.stderr
        assert re.search(r"^bridge cloud$", out.stdout, re.M)
        assert re.search(r"^  state\s+connected$", out.stdout, re.M)
        assert re.search(rf"^  address\s+127\.0\.0\.1:{cloud.port}$", out.stdout, re.M)
        assert re.search(r"^  queued\s+0$", out.stdout, re.M)
    finally:
        assert proc.stop() == 0
    out = _ledge("bridge", "test", "ledge/gw1/sensors/t", "-c", str(config))
    assert out.returncode == 0
    assert "bridge cloud (out to the remote): -> 's1/sensors/t' (rule 1)" in out.stdout
    out = _ledge("bridge", "test", "ledge/gw2/sensors/t", "-c", str(config))
    assert out.returncode == 1
    assert "does not start with the prefix 'ledge/gw1/'" in out.stdout
    out = _ledge("bridge", "status", "--broker", f"127.0.0.1:{free_port()}")
    assert out.returncode == 1 and "cannot read bridge status" in out.stderr


def _ledge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ),
    )


# ---------------------------------------------------------------------- health


def test_health_reports_count_drops_and_follow_the_contract(tmp_path: Path, cloud: Cloud) -> None:
    cloud.port = free_port()  # the uplink is down throughout
    config = bridge_config(
        tmp_path,
        cloud.port,
        rule("t/#"),
        bridge='outbox = { max_messages = 5, when_full = "drop-newest" }',
        top="",
    )
    config.write_text(config.read_text().replace('id = "gw1"', 'id = "gw1"\nhealth_interval = 0.2'))
    proc = LedgeProcess(config=config).start()
    try:
        watch = Paho(proc.port, "health-watch").connect()
        watch.subscribe("ledge/gw1/health", 1)
        pub = Paho(proc.port, "producer").connect()
        for i in range(8):
            pub.publish("t/x", b"%d" % i, 1)
        reports: list[tuple[str, Health]] = []

        def dropped_so_far() -> int:
            reports[:] = [health_from_message(m.topic, m.payload) for m in watch.messages]
            return sum(h.dropped for _, h in reports)

        wait_for(lambda: dropped_so_far() == 3, 5, "three drops reported")
        assert all(gateway == "gw1" for gateway, _ in reports)
        assert reports[-1][1].queued == 5
        watch.disconnect()
        pub.disconnect()
    finally:
        assert proc.stop() == 0
