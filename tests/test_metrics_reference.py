"""What ``/metrics`` serves says what the metrics reference says.

The reference (docs/reference/metrics.md) is what a user writes alerts and dashboards
against: each family's type, HELP text and labels (with their values where it lists
them). The in-process worlds of tests/test_metrics_collect.py -- a busy broker with a
bridge, serial and BLE devices, taps, and the firmware bridge -- serve their families
here, and each must be in the reference exactly as served."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_metrics_collect import everything_world, mqttsn_world

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "metrics.md"
ROW = re.compile(r"^\| `([a-z_:]+)` \| (counter|gauge) \| (.*?) \| (.*) \|$")
LABEL = re.compile(r"`([a-z_]+)`(?: \(([^)]*)\))?")


def reference() -> dict[str, tuple[str, str, dict[str, set[str]]]]:
    """name -> (type, HELP text, label -> the values listed, empty: any)."""
    out = {}
    for line in REFERENCE.read_text().splitlines():
        row = ROW.match(line)
        if row is None:
            continue
        name, kind, labels, meaning = row.groups()
        listed = {
            label: set(re.findall(r"`([^`]*)`", values or ""))
            for label, values in LABEL.findall(labels)
        }
        out[name] = (kind, meaning.replace("\\|", "|").replace("&lt;", "<"), listed)
    return out


def served(text: str) -> dict[str, tuple[str, str, list[dict[str, str]]]]:
    """name -> (type, HELP text, each sample's labels), from an exposition."""
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples: dict[str, list[dict[str, str]]] = {name: [] for name in types}
    for name, labels in re.findall(r"^([a-z_:]+)(?:\{(.*)\})? \S+$", text, re.M):
        family = name if name in types else re.sub(r"_(bucket|sum|count)$", "", name)
        samples[family].append(dict(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', labels)))
    return {
        name: (kind, helps[name].replace("\\\\", "\\").replace("\\n", "\n"), samples[name])
        for name, kind in types.items()
    }


def expositions(tmp_path: Path) -> str:
    world = everything_world()
    _, mqttsn = mqttsn_world()
    world.collector.register(mqttsn)
    return world.collector.metrics() + gateway_exposition(tmp_path)


def test_every_family_served_is_in_the_reference_with_its_type_help_and_labels(
    tmp_path: Path,
) -> None:
    documented = reference()
    families = served(expositions(tmp_path))
    assert len(documented) > 100 and len(families) > 80
    for name, (kind, help_text, samples) in families.items():
        assert name in documented, f"{name} is served but not in the reference"
        doc_kind, doc_help, doc_labels = documented[name]
        assert (kind, help_text) == (doc_kind, doc_help), name
        for labels in samples:
            assert set(labels) <= set(doc_labels), (name, labels, doc_labels)
            for label, value in labels.items():
                values = doc_labels[label]
                assert not values or value in values, (name, label, value, values)


def test_the_worlds_serve_every_family_of_the_reference(tmp_path: Path) -> None:
    """So the test above judges every one of them."""
    missing = set(reference()) - set(served(expositions(tmp_path)))
    assert missing == set(), sorted(missing)


def gateway_exposition(tmp_path: Path) -> str:
    """A whole gateway in this process: its store under data_dir, a WebSocket listener,
    the HTTP listener that has answered once, a system update given up (the families
    only a running gateway has)."""
    import asyncio

    from gateway.app.config import parse_config
    from gateway.app.root import Gateway

    record = tmp_path / "update-last"
    record.write_text(
        "outcome=rolled-back\nslot=B\nfrom=A\nat=2026-12-01T10:00:00Z\nreason=not healthy\n"
    )
    config = parse_config(
        f'data_dir = "{tmp_path}"\n[gateway]\nid = "gw1"\n'
        f'system_update_file = "{record}"\n'
        '[[listeners]]\nname = "mqtt"\nhost = "127.0.0.1"\nport = 0\n'
        '[[listeners]]\nname = "ws"\nhost = "127.0.0.1"\nport = 0\ntype = "websocket"\n'
        '[http]\nenabled = true\nhost = "127.0.0.1"\nport = 0\n'
    ).to_runtime()

    async def run() -> str:
        gw = Gateway(config)
        await gw.start()
        try:
            assert gw.metrics is not None and gw.metrics.http is not None
            host, port = gw.metrics.http.addresses[0]
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert (await reader.read()).startswith(b"HTTP/1.1 404 ")
            writer.close()
            return gw.metrics.collector.metrics()
        finally:
            await gw.close()

    return asyncio.run(run())
