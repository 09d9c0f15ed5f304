"""The BLE scanner's repairs, in process: what the gateway does when BlueZ or the
adapter leaves and comes back while a repair is running.

The scanner here is a stand-in whose restarts the test finishes by hand (a real
bluetoothd cannot be paused between two D-Bus calls); everything around it -- the
watchdog, the hub, the repair sequencing -- is Ledge's own. The same story over the
real bleak and the mock BlueZ is tests/test_ble.py::test_bluez_killed_and_restarted."""

from __future__ import annotations

import asyncio

from bleak.exc import BleakError

from drivers.ble.watchdog import Action, State
from gateway.app.config import parse_config
from gateway.broker.core import Broker
from gateway.broker.settings import BrokerSettings
from gateway.sensors.ble import BleSensors
from gateway.sensors.hub import SensorHub
from tests.support.wait import async_wait_for

CONFIG = (
    '[gateway]\nid = "gw1"\n[bluetooth]\nwatchdog = 30\n'
    '[[ble]]\nname = "t"\naddress = "A4:C1:38:00:00:08"\n'
)


class Bus:
    async def connect(self) -> None:
        return None


class Scanner:
    """Restarts that end when the test says, failing or not."""

    def __init__(self) -> None:
        self.bluez = Bus()
        self.running = False
        self.mode = "passive"
        self.restarts: list[asyncio.Future[BaseException | None]] = []

    async def restart(self) -> None:
        outcome: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.restarts.append(outcome)
        error = await outcome
        if error is not None:
            raise error
        self.running = True

    async def power_cycle(self) -> None:
        raise AssertionError("no power cycle expected")


def sensors() -> tuple[BleSensors, Scanner]:
    settings = parse_config(CONFIG).to_runtime().sensors
    hub = SensorHub(Broker(BrokerSettings()), settings, lambda: 100.0)
    ble = hub.ble
    assert ble is not None
    scanner = Scanner()
    ble.scanner = scanner  # type: ignore[assignment]
    return ble, scanner


def test_an_adapter_back_during_a_failing_restart_restarts_the_scanner_again() -> None:
    """BlueZ comes back before its adapter: the restart it asks for finds no adapter.
    The adapter's return during that restart is not dropped as a second repair: the
    scanner is restarted again as soon as the first ends, not after the backoff."""

    async def story() -> None:
        ble, scanner = sensors()
        ble._loop = asyncio.get_running_loop()
        ble._lost_or_back(False, "bluez", "BlueZ (org.bluez)")
        assert ble.watchdog.state is State.ABSENT
        ble._bluez_presence(True)
        await async_wait_for(lambda: len(scanner.restarts) == 1, 5, "the first restart")
        ble._adapter_presence(True)  # while the first restart still runs
        assert len(scanner.restarts) == 1  # one repair at a time
        scanner.restarts[0].set_result(BleakError("adapter hci0 not found"))
        await async_wait_for(lambda: len(scanner.restarts) == 2, 5, "a second restart")
        scanner.restarts[1].set_result(None)
        await async_wait_for(lambda: ble._action is not None and ble._action.done(), 5, "its end")
        assert scanner.running
        assert ble.watchdog.counts.restarts == 2
        await asyncio.sleep(0)
        assert len(scanner.restarts) == 2  # and no third

    asyncio.run(story())


def test_a_return_during_a_repair_that_succeeds_restarts_once_more_only() -> None:
    """Two returns during one repair make one more restart, not two."""

    async def story() -> None:
        ble, scanner = sensors()
        ble._loop = asyncio.get_running_loop()
        ble._lost_or_back(False, "adapter", "adapter hci0")
        ble._adapter_presence(True)
        await async_wait_for(lambda: len(scanner.restarts) == 1, 5, "the first restart")
        ble._adapter_presence(True)
        ble._bluez_presence(True)
        scanner.restarts[0].set_result(None)
        await async_wait_for(lambda: len(scanner.restarts) == 2, 5, "a second restart")
        scanner.restarts[1].set_result(None)
        await async_wait_for(lambda: ble._action is not None and ble._action.done(), 5, "its end")
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(scanner.restarts) == 2

    asyncio.run(story())


def test_a_watchdog_step_during_a_repair_is_not_queued() -> None:
    """The watchdog's own steps come again on the next tick: only returns are kept."""

    async def story() -> None:
        ble, scanner = sensors()
        ble._loop = asyncio.get_running_loop()
        ble._lost_or_back(False, "bluez", "BlueZ (org.bluez)")
        ble._bluez_presence(True)
        await async_wait_for(lambda: len(scanner.restarts) == 1, 5, "the first restart")
        ble._act(Action.RESTART)
        scanner.restarts[0].set_result(None)
        await async_wait_for(lambda: ble._action is not None and ble._action.done(), 5, "its end")
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(scanner.restarts) == 1

    asyncio.run(story())
