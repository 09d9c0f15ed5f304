# A device that does what the test tells it, one command per line on stdin, with the
# real client library; every outcome is a JSON line on stdout. Commands:
#   connect | discover | publish TOPIC QOS PAYLOAD | subscribe TOPIC QOS | register TOPIC
#   ping | sleep SECONDS | wake | disconnect | keepalive | stats | exit
import asyncio
import gc
import json

import hostio
import mqttsn
from hostports import HostSocket, HostUART


def out(event, **fields):
    fields["event"] = event
    print(json.dumps(fields))


def on_message(topic, payload, retained):
    out("message", topic=topic, payload=payload.decode(), retained=retained)


async def main():
    cfg = json.loads(hostio.config())
    gc.collect()
    before = gc.mem_alloc()
    if cfg.get("transport", "udp") == "udp":
        host = cfg.get("host")  # None: discover the gateway
        transport = mqttsn.UDPTransport(host, hostio.gateway_port(), sock=HostSocket())
    else:
        transport = mqttsn.UARTTransport(HostUART())
    client = mqttsn.Client(
        transport,
        cfg["client_id"],
        keepalive=cfg.get("keepalive", 60),
        clean=cfg.get("clean", True),
        will=cfg.get("will"),
        on_message=on_message,
        predefined=cfg.get("predefined"),
        retry_ms=cfg.get("retry_ms", 300),
        max_retry_ms=cfg.get("max_retry_ms", 1200),
        retries=cfg.get("retries", 3),
    )
    gc.collect()
    out("ready", ram=gc.mem_alloc() - before)
    while True:
        line = hostio.ctl_take()
        if not line:
            await asyncio.sleep_ms(5)
            continue
        words = line.split(" ", 3)
        cmd = words[0]
        try:
            if cmd == "connect":
                await client.connect()
            elif cmd == "discover":
                out("gateway", gw_id=await client.discover(5000))
            elif cmd == "publish":
                await client.publish(words[1], words[3], int(words[2]))
            elif cmd == "subscribe":
                await client.subscribe(words[1], int(words[2]))
            elif cmd == "unsubscribe":
                await client.unsubscribe(words[1])
            elif cmd == "register":
                await client.register(words[1])
            elif cmd == "ping":
                await client.ping()
            elif cmd == "sleep":
                await client.sleep(int(words[1]))
            elif cmd == "wake":
                await client.wake()
            elif cmd == "disconnect":
                await client.disconnect()
            elif cmd == "keepalive":
                asyncio.create_task(client.keep_alive())
            elif cmd == "stats":
                hostio.js_gc()
                await asyncio.sleep_ms(0)
                gc.collect()
                out(
                    "stats",
                    resends=client.resends,
                    reconnects=client.reconnects,
                    dropped=client.dropped,
                    ram=gc.mem_alloc() - before,
                )
            elif cmd == "exit":
                out("ok", cmd=cmd)
                return
            out("ok", cmd=cmd)
        except Exception as exc:  # report it, keep serving
            out("error", cmd=cmd, error=repr(exc))
