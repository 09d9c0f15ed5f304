"""Run amqtt's broker the way its documentation shows (``Broker(config)``, ``start()``).

    python -m bench.amqtt_broker --port PORT [--max-connections N]

Used only when amqtt is importable; the benchmark skips it otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from typing import Any


def config(port: int, max_connections: int) -> dict[str, Any]:
    return {
        "listeners": {
            "default": {
                "type": "tcp",
                "bind": f"127.0.0.1:{port}",
                "max-connections": max_connections,
            }
        },
        "sys_interval": 10,
        "auth": {"allow-anonymous": True, "plugins": ["auth_anonymous"]},
        "topic-check": {"enabled": False},
    }


async def serve(port: int, max_connections: int) -> None:
    broker_module: Any = importlib.import_module("amqtt.broker")
    broker = broker_module.Broker(config(port, max_connections))
    await broker.start()
    loop = asyncio.get_running_loop()
    stop = loop.create_future()

    def on_signal() -> None:
        if not stop.done():
            stop.set_result(None)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await stop
    await broker.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.amqtt_broker")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-connections", type=int, default=0)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.max_connections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
