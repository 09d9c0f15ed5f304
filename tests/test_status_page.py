"""The status page in a real headless browser (Debian's chromium through
chromium-driver and selenium) against ``ledge run`` with MQTT clients, a pty serial
sensor and a bridge to Debian's Mosquitto: the page is readable with JavaScript off,
and with it on it follows what the test changes (a new client, a new reading, the
uplink going down). A screenshot is kept in tests/output/."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Paho
from tests.support.procs import REPO, LedgeProcess, MosquittoProcess
from tests.support.prometheus import cloud_bridge
from tests.support.wait import wait_for
from tests.test_serial import FakeDevice

pytest.importorskip("selenium")
from selenium.webdriver import Chrome
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
OUTPUT = REPO / "tests" / "output"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()),
        reason="Debian's chromium and chromium-driver",
    ),
    pytest.mark.skipif(not MosquittoProcess.available(), reason="Debian's mosquitto"),
]


def browser(profile: Path, javascript: bool = True) -> Chrome:
    options = Options()
    options.binary_location = CHROMIUM
    # Without these, Chromium reaches for the network at start and stalls on a closed one.
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1100",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    if not javascript:
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2}
        )
    driver = Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    return driver


@pytest.fixture
def device(tmp_path: Path) -> Iterator[FakeDevice]:
    d = FakeDevice(tmp_path / "serial-by-id-usb-env")
    yield d
    d.close()


def text(driver: WebDriver, css: str) -> str:
    """The text of the first element matching ``css`` now, read in one step (the page
    replaces its sections while it runs)."""
    script = "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''"
    return str(driver.execute_script(script, css)).strip()


#: Every table cell against its column's heading, as the browser laid them out: the same
#: alignment, the text's edges on the same line (right edges for numbers, left ones
#: otherwise), and the text inside its column. The problems found, as text.
LAYOUT_PROBLEMS = """
const box = e => { const r = document.createRange(); r.selectNodeContents(e);
  return r.getBoundingClientRect(); };
const problems = [];
for (const table of document.querySelectorAll("main table")) {
  const heads = [...table.rows[0].cells];
  for (const row of [...table.rows].slice(1)) {
    [...row.cells].forEach((cell, i) => {
      const head = heads[i], where = table.closest("section").id + " / " + head.textContent;
      const align = getComputedStyle(cell).textAlign, headAlign = getComputedStyle(head).textAlign;
      const text = box(cell), heading = box(head), column = head.getBoundingClientRect();
      if (align !== headAlign) problems.push(where + ": cell " + align + ", heading " + headAlign);
      if (!text.width) return;
      const off = align === "right" ? text.right - heading.right : text.left - heading.left;
      if (Math.abs(off) > 1)
        problems.push(where + ": text " + off.toFixed(1) + " px off its heading");
      if (text.left < column.left - 0.5 || text.right > column.right + 0.5)
        problems.push(where + ": text outside its column");
    });
  }
}
return problems;
"""


def layout_problems(driver: WebDriver) -> list[str]:
    problems = driver.execute_script(LAYOUT_PROBLEMS)
    assert isinstance(problems, list)
    return [str(p) for p in problems]


def api_status(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as r:
        doc: dict[str, Any] = json.load(r)
    return doc


def test_the_status_page_follows_clients_sensors_and_the_bridge(
    tmp_path: Path, device: FakeDevice
) -> None:
    cloud = MosquittoProcess(tmp_path).start()
    config = tmp_path / "ledge.toml"
    config.write_text(
        f"""
[gateway]
id = "gw1"
[http]
enabled = true
port = 0
[[serial]]
name = "env"
path = "{device.link}"
protocol = "kv"
fields = {{ temp = {{ quantity = "temperature", unit = "°C" }} }}
{cloud_bridge(cloud.port, "ledge/#")}"""
    )
    ledge = LedgeProcess(config=config).start(listeners=2)
    clients = [
        Paho(ledge.port, "page-v5").connect(),
        Paho(ledge.port, "page-v3", version=4).connect(),
    ]
    driver: Chrome | None = None
    try:
        ledge.wait_log("env: connected at")
        device.send(b"temp=21.5\n")
        # A QoS 0 message for a session that is offline: dropped, by a named reason.
        parked = Paho(ledge.port, "page-parked").connect(clean=False, session_expiry=300)
        parked.subscribe("drop/#", qos=0)
        parked.disconnect()
        clients[0].publish("drop/x", b"x", qos=0)
        wait_for(
            lambda: api_status(ledge.ports[1])["drops"].get("QoS 0 for an offline session"),
            10,
            "the drop to be counted",
        )
        url = f"http://127.0.0.1:{ledge.ports[1]}/"

        # JavaScript off: everything is on the page as served.
        static = browser(tmp_path / "profile-static", javascript=False)
        try:
            static.get(url)
            assert text(static, '[data-listener="listener 0"] td:nth-child(4)') == "1"
            assert text(static, '[data-listener="listener 0"] td:nth-child(5)') == "1"
            assert text(static, '[data-device="env"] [data-quantity="temperature"] b') == "21.5"
            assert text(static, '[data-bridge="cloud"] .state') == "connected"
            assert text(static, '[data-bridge="cloud"] .since').startswith("up since ")
            assert "QoS 0 for an offline session" in text(static, "#drops")
            assert static.find_element(By.TAG_NAME, "body").get_attribute("data-live") is None
            assert not layout_problems(static)
        finally:
            static.quit()

        driver = browser(tmp_path / "profile-live")
        driver.get(url)
        wait = WebDriverWait(driver, 20, poll_frequency=0.2)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-live"))
        # Changes after the page loaded reach it through /api/status.
        clients.append(Paho(ledge.port, "page-late").connect())
        device.send(b"temp=23.25\n")
        stopped = time.time()
        cloud.stop()
        wait.until(lambda d: text(d, '[data-listener="listener 0"] td:nth-child(5)') == "2")
        wait.until(
            lambda d: text(d, '[data-device="env"] [data-quantity="temperature"] b') == "23.25"
        )
        wait.until(
            lambda d: text(d, '[data-bridge="cloud"] .state') in ("disconnected", "connecting")
        )
        wait.until(lambda d: "bridge cloud" in text(d, "#warnings"))
        # The outage: since when, and the error that ended the link, with its time.
        wait.until(lambda d: text(d, '[data-bridge="cloud"] .since').startswith("down since "))
        wait.until(lambda d: text(d, '[data-bridge="cloud"] .error').endswith(" ago)"))
        (bridge,) = api_status(ledge.ports[1])["bridges"]
        assert bridge["since"] >= stopped and bridge["last_error_at"] >= stopped
        assert not layout_problems(driver)
        # Back up: the old error stays, with its time, muted.
        started = time.time()
        cloud.start(cloud.port)
        wait.until(lambda d: text(d, '[data-bridge="cloud"] .state') == "connected")
        wait.until(lambda d: text(d, '[data-bridge="cloud"] .since').startswith("up since "))
        (bridge,) = api_status(ledge.ports[1])["bridges"]
        # The bridge may have failed once more between ``started`` and Mosquitto
        # listening: the error kept is one from before the link came up.
        assert bridge["since"] >= started and bridge["last_error_at"] <= bridge["since"]
        error = driver.find_element(By.CSS_SELECTOR, '[data-bridge="cloud"] .error')
        assert error.text.endswith(" ago)") and "mute" in str(error.get_attribute("class"))
        assert "QoS 0 for an offline session" in text(driver, "#drops")
        assert not layout_problems(driver)
        assert "°C" in text(driver, '[data-device="env"] [data-quantity="temperature"]')
        assert text(driver, '[data-device="env"] td:nth-child(3)') == "connected"
        assert driver.title == "Ledge gw1"
        # No script error reached the console (the page's own code ran clean).
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        OUTPUT.mkdir(exist_ok=True)
        driver.save_screenshot(str(OUTPUT / "status-page.png"))
    finally:
        if driver is not None:
            driver.quit()
        for client in clients:
            client.disconnect()
        cloud.stop()
        assert ledge.stop() == 0
