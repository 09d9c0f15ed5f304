# The shared vectors (firmware-bridge/vectors/) checked on MicroPython: the client's
# framing and codec must give the bytes the gateway's do. Prints one JSON line.
import json

import mqttsn
import uframe


def unhex(text):
    return bytes(int(text[i : i + 2], 16) for i in range(0, len(text), 2))


def main_sync():
    failures = []
    uart = json.load(open("/data/uart.json"))
    for v in uart["frames"]:
        message, frame = unhex(v["message"]), unhex(v["frame"])
        if uframe.encode_frame(message) != frame:
            failures.append("encode " + v["name"])
        got = []
        deframer = uframe.Deframer(1024)
        for i in range(len(frame)):
            deframer.feed(frame[i : i + 1], got)
        if got != [message]:
            failures.append("deframe " + v["name"])
        if "crc" in v and uframe.crc16(message) != v["crc"]:
            failures.append("crc")
    for v in uart["streams"]:
        stream = unhex(v["stream"])
        deframer = uframe.Deframer(v.get("max_message", 1024))
        got = []
        for i in range(0, len(stream), 3):
            deframer.feed(stream[i : i + 3], got)
        if got != [unhex(m) for m in v["messages"]] or deframer.errors != v["errors"]:
            failures.append(
                "stream %s: %d messages, %d errors" % (v["name"], len(got), deframer.errors)
            )
    vectors = json.load(open("/data/mqttsn.json"))
    checked = 0
    for v in vectors["messages"]:
        data = unhex(v["hex"])
        parsed = mqttsn.parse(data)
        if v["type"] == "ENCAPSULATED":
            continue  # a gateway matter: the client never sees a forwarder
        if parsed is None:
            failures.append("parse " + v["name"])
            continue
        if v["canonical"] and mqttsn.message(parsed[0], bytes(parsed[1])) != data:
            failures.append("message " + v["name"])
        checked += 1
    for v in vectors["malformed"]:
        data = unhex(v["hex"])
        if v["name"].startswith(
            ("length-", "trailing", "three-octet", "no-msgtype", "cut-", "empty")
        ):
            if mqttsn.parse(data) is not None:
                failures.append("accepted malformed " + v["name"])
    f = {m["name"]: m["fields"] for m in vectors["messages"]}
    # The client's own encoders against the hand-written vectors.
    c = f["connect-clean"]
    if mqttsn.message(mqttsn.CONNECT, bytes((4, 1, 0, c["duration"])) + b"dev1") != unhex(
        [m for m in vectors["messages"] if m["name"] == "connect-clean"][0]["hex"]
    ):
        failures.append("client CONNECT encoding")
    print(json.dumps({"failures": failures, "messages": checked, "frames": len(uart["frames"])}))


main_sync()
