"""``[mqttsn]`` in the config file: validation names key path and line, the runtime
form survives its trip to the gateway process, and nothing of MQTT-SN loads unless a
transport is configured."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.app.config import parse_config
from gateway.app.runtime import ConfigError, RuntimeConfig


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[mqttsn]\npredefined_topics = { 0 = 'a/b' }\n",
            r"mqttsn\.predefined_topics \(line 2\): .*topic id 0 is not 1\.\.65534",
        ),
        (
            "[mqttsn]\npredefined_topics = { 3 = 'a/#' }\n",
            r"mqttsn\.predefined_topics \(line 2\): .*topic id 3",
        ),
        ("[mqttsn]\nqueue_policy = 'drop-all'\n", r"mqttsn\.queue_policy \(line 2\)"),
        ("[[mqttsn.udp]]\nport = 70000\n", r"mqttsn\.udp\[0\]\.port \(line 2\)"),
        (
            "[[mqttsn.udp]]\nport = 1\n[[mqttsn.udp]]\nport = 1\n",
            r"two MQTT-SN transports are named 'udp 127\.0\.0\.1:1'",
        ),
        ("[[mqttsn.serial]]\nname = 'x'\n", r"mqttsn\.serial\[0\]\.path .*: Field required"),
        ("[[mqttsn.udp]]\nbroadcast = ['host:99999']\n", r"mqttsn\.udp\[0\]\.broadcast"),
    ],
)
def test_config_errors_name_the_key(text: str, expected: str) -> None:
    import re

    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.toml")
    assert re.search(expected, str(info.value)), str(info.value)


def test_runtime_settings_survive_json() -> None:
    config = parse_config(
        "[mqttsn]\npredefined_topics = { 1 = 'a/b', 500 = 'c' }\nmax_clients = 7\n"
        "[[mqttsn.udp]]\nhost = '::'\nport = 0\nbroadcast = ['ff02::1']\n"
        "allow_client_ids = ['x']\n"
        "[[mqttsn.serial]]\nname = 'radio'\npath = '/dev/ttyUSB0'\n"
    )
    runtime = config.to_runtime()
    again = RuntimeConfig.from_json(runtime.to_json())
    assert again.mqttsn == runtime.mqttsn
    assert again.mqttsn.predefined_topics == {1: "a/b", 500: "c"}
    assert again.mqttsn.udp[0].label == "udp :::0"


def test_nothing_of_mqttsn_is_imported_without_a_transport() -> None:
    """The default gateway stays small: the firmware bridge's code loads only when a
    transport is configured (its settings dataclass is all the config carries)."""
    code = (
        "import sys, asyncio\n"
        "from gateway.app.config import parse_config\n"
        "from gateway.app.root import Gateway\n"
        "async def main():\n"
        "    g = Gateway(parse_config('[[listeners]]\\nport = 0\\n').to_runtime())\n"
        "    await g.start()\n"
        "    loaded = sorted(m for m in sys.modules if 'mqttsn' in m)\n"
        "    await g.close()\n"
        "    print(loaded)\n"
        "asyncio.run(main())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['gateway.mqttsn', 'gateway.mqttsn.settings']"
