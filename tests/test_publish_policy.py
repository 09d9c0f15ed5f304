"""One PUBLISH policy: the order of the checks, pinned where two of them refuse at once.

A QoS 1 PUBLISH that the ACL denies while a publish gate (a bridge's full outbox with
the policy "refuse", or a full store) refuses too gets the ACL's answer -- the more
specific one: MQTT 5.0 PUBACK 0x87; MQTT 3.1.1, which has no refusal code, a plain
PUBACK and the connection stays open. Plain PUBLISHes (the fast path) and retained ones
(the general path) get the same answer, in the pure core and over real sockets.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.broker.acl import parse_acl_file
from gateway.mqtt import (
    MQTT_5,
    MQTT_311,
    PingReq,
    PingResp,
    PubAck,
    Publish,
    Subscribe,
    SubscriptionRequest,
    encode,
)
from gateway.mqtt.reason_codes import ReasonCode
from tests.support.harness import Harness
from tests.support.procs import LedgeProcess, dead_port
from tests.support.raw import Raw

ACL = "topic readwrite t/open/#\ntopic read t/#\n"


def refusing_gate(topic: str, size: int) -> str | None:
    return f"outbox full for {topic!r}"


@pytest.mark.parametrize("retain", [False, True], ids=["plain", "retained"])
@pytest.mark.parametrize(
    ("version", "code"), [(MQTT_5, ReasonCode.NOT_AUTHORIZED), (MQTT_311, 0)], ids=["v5", "v311"]
)
def test_acl_denial_wins_over_a_refusing_gate_in_the_core(
    version: int, code: int, retain: bool
) -> None:
    h = Harness()
    h.broker.acl = parse_acl_file(ACL)
    h.broker.publish_gates.append(refusing_gate)
    sub = h.client()
    sub.connect("sub")
    sub.subscribe("t/#", 1)
    pub = h.client(version)
    pub.connect("pub")
    pub.send(Publish("t/closed/x", b"no", 1, retain, packet_id=5))
    assert pub.take() == [PubAck(5, code)]
    assert not pub.closed
    assert sub.take() == []
    stats = h.broker.stats
    assert (stats.publish_received, stats.publish_denied, stats.protocol_errors) == (1, 1, 0)


@pytest.mark.parametrize("version", [MQTT_5, MQTT_311], ids=["v5", "v311"])
def test_a_gate_alone_refuses_with_quota_exceeded_or_closes_311(version: int) -> None:
    """The gate still answers when the ACL allows: 0x97, or a closed 3.1.1 connection."""
    h = Harness()
    h.broker.acl = parse_acl_file(ACL)
    h.broker.publish_gates.append(refusing_gate)
    pub = h.client(version)
    pub.connect("pub")
    pub.send(Publish("t/open/x", b"no", 1, packet_id=6))
    if version == MQTT_5:
        assert pub.take() == [PubAck(6, ReasonCode.QUOTA_EXCEEDED)]
    else:
        assert pub.closed


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[LedgeProcess]:
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    acl.chmod(0o600)
    config = tmp_path / "ledge.toml"
    with dead_port() as dead:  # nobody listens: the outbox only fills
        config.write_text(
            f'[auth]\nacl_file = "{acl}"\n'
            "[[bridges]]\n"
            'name = "cloud"\n'
            f'address = "127.0.0.1:{dead}"\n'
            "reconnect_min = 5.0\nreconnect_max = 5.0\n"
            'outbox = { max_messages = 1, when_full = "refuse" }\n'
            '[[bridges.rules]]\nfilter = "t/#"\n'
        )
        proc = LedgeProcess(config=config).start()
        yield proc
        assert proc.stop() == 0


def test_acl_denial_wins_over_a_full_outbox_over_sockets(gateway: LedgeProcess) -> None:
    try:
        sub = Raw(gateway.port)
        sub.connect("watcher")
        sub.send(encode(Subscribe(1, (SubscriptionRequest("t/#", 1),)), MQTT_5))
        sub.expect(1)
        filler = Raw(gateway.port)
        filler.connect("filler")
        filler.send(encode(Publish("t/open/a", b"fills", 1, packet_id=1), MQTT_5))
        assert filler.expect(1) == [PubAck(1)]  # the outbox is full now
        filler.send(encode(Publish("t/open/b", b"refused", 1, packet_id=2), MQTT_5))
        assert filler.expect(1) == [PubAck(2, ReasonCode.QUOTA_EXCEEDED)]
        for version, code in ((MQTT_5, ReasonCode.NOT_AUTHORIZED), (MQTT_311, 0)):
            pub = Raw(gateway.port, version)
            pub.connect(f"pub{version}")
            for pid, retain in ((10, False), (11, True)):
                pub.send(encode(Publish("t/closed/x", b"no", 1, retain, packet_id=pid), version))
                assert pub.expect(1) == [PubAck(pid, code)], (version, retain)
            pub.send(encode(PingReq(), version))
            assert pub.expect(1) == [PingResp()]  # still connected
            pub.close()
        got = sub.expect(1)  # only the filler's accepted message ever arrived
        assert [p.topic for p in got if isinstance(p, Publish)] == ["t/open/a"]
        sub.send(encode(PingReq(), MQTT_5))
        assert sub.expect(1) == [PingResp()]
        sub.close()
        filler.close()
    finally:
        assert gateway.stop() == 0
