"""The status document of a whole gateway in the test's own process: its listeners as
bound, its store, its bridge (to another Ledge standing in for the cloud) with the
outbox and the times the page and ``ledge status`` show; a cloud away, then back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.support.wait import async_wait_for
from tests.test_bridge_link import CLOUD, bridge_of, edge, port_of, publisher, started


def test_the_status_document_shows_the_listeners_the_store_and_the_bridge(
    tmp_path: Path,
) -> None:
    async def story() -> None:
        cloud = await started(CLOUD.format(port=0))
        port = port_of(cloud)
        extra = (
            "[bridges.outbox]\nmax_messages = 5\n"
            '[http]\nenabled = true\nhost = "127.0.0.1"\nport = 0\n'
        )
        gw = await started(f'data_dir = "{tmp_path}"\n' + edge(port, extra=extra))
        bridge = bridge_of(gw)
        try:
            await async_wait_for(lambda: bridge.state == "connected", 10, "connected")
            assert gw.metrics is not None and gw.server is not None
            collector = gw.metrics.collector
            doc = collector.status()
            bound = port_of(gw)
            assert [(lst["name"], lst["type"], lst["address"]) for lst in doc["listeners"]] == [
                ("mqtt", "tcp", f"127.0.0.1:{bound}")
            ]
            assert doc["store"] is not None and doc["store"]["free_disk_bytes"] > 0
            [up] = doc["bridges"]
            assert (up["name"], up["state"], up["address"]) == (
                "up", "connected", f"127.0.0.1:{port}"
            )  # fmt: skip
            assert (up["outbox_messages"], up["last_error"]) == (0, "")
            assert abs(up["since"] - time.time()) < 30
            await cloud.close()  # the cloud goes away: messages wait
            await async_wait_for(lambda: bridge.state != "connected", 10, "the link lost")
            publish = publisher(gw)
            for i in range(4):
                publish("sensors/t", str(i).encode() * 100)
            doc = collector.status()
            [up] = doc["bridges"]
            assert up["state"] != "connected" and up["outbox_messages"] == 4
            assert up["outbox_bytes"] >= 4 * 100 and up["last_error"] != ""
            assert up["last_error_at"] is not None and abs(up["last_error_at"] - time.time()) < 30
            assert up["oldest_age_seconds"] >= 0
            assert "bridge up: outbox near full (4 messages, 0.0 MiB)" in doc["warnings"]
            cloud = await started(CLOUD.format(port=port))
            await async_wait_for(
                lambda: collector.status()["bridges"][0]["outbox_messages"] == 0,
                15,
                "the backlog sent",
            )
            [up] = collector.status()["bridges"]
            assert (up["state"], up["sent"], up["acknowledged"]) == ("connected", 4, 4)
        finally:
            await gw.close()
            await cloud.close()

    asyncio.run(story())
