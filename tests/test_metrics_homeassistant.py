"""The gateway as a Home Assistant device, in process: what ``HomeAssistantGateway``
puts on the broker when it starts (retained discovery, then its state) and again every
interval, read back as a subscriber would get it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from drivers.homeassistant import gateway_sensor_configs
from gateway.metrics.collect import TICK, HomeAssistantGateway
from gateway.metrics.view import gateway_state
from tests.test_metrics_collect import busy_world


def test_it_announces_itself_retained_and_publishes_its_state_every_interval() -> None:
    w, (_old, pub) = busy_world()
    for burst in range(10):  # ten intervals of 5 s, each with its own message rate
        w.collector.tick()
        w.h.now += TICK
        for _ in range(burst * 5):
            pub.publish("a/b", b"x")
    w.collector.tick()
    settings = replace(w.hub.settings, discovery_prefix="ha")
    ha = HomeAssistantGateway(w.collector, settings, ("cloud", "backup"), True, 30.0)
    assert (ha.status_topic, ha.state_topic) == ("ledge/gw1/status", "ledge/gw1/metrics")

    async def story() -> list[float]:
        loop = asyncio.get_running_loop()
        ha.start(loop)
        assert ha._timer is not None
        due = [ha._timer.when() - loop.time()]
        ha._timer.cancel()
        ha._publish(loop)  # as the timer does when the interval has passed: a new one set
        due.append(ha._timer.when() - loop.time())
        ha.stop()
        assert ha._timer is None
        return due

    due = asyncio.run(story())
    assert all(29.0 < d <= 30.0 for d in due), due
    messages = w.broker.retained.matching("ha/#", w.h.now)
    assert {m.qos for m in messages} == {1}
    announced = {m.topic: m.payload for m in messages}
    expected = gateway_sensor_configs(
        "ha", "gw1", "ledge/gw1/status", "ledge/gw1/metrics", ("cloud", "backup"), True
    )
    assert announced == dict(expected)
    [state] = w.broker.retained.matching("ledge/gw1/metrics", w.h.now)
    window = round(30.0 / TICK)  # the rates: averaged over the interval's ticks
    got = json.loads(state.payload)
    assert got == gateway_state(w.collector.status(), window)
    assert got["messages_in"] == 6.5  # the last 6 ticks: 20..45 messages per 5 s, 4..9 per s
    assert state.qos == 0
