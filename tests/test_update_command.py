"""``ledge update``, in the test's own process, around stand-ins for what only the device
has (``rauc``, ``systemctl``: small scripts on PATH that record how they were called);
downloads come from a real HTTP server on loopback. The real RAUC installing a real
bundle on the booted image is ``tests/test_image.py``."""

from __future__ import annotations

import argparse
import http.server
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import update
from gateway.cli.main import main

BUNDLE = b"bundle bytes " * 50_000  # 650 kB: several chunks, a progress line or more


@pytest.fixture
def device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A system with update slots: RAUC's config, the data partition's update
    directory, ``rauc`` and ``systemctl`` stand-ins. Returns the file of recorded calls."""
    conf = tmp_path / "system.conf"
    conf.write_text("[system]\ncompatible=ledge-raspberrypi-arm64\n")
    monkeypatch.setattr(update, "RAUC_CONF", conf)
    monkeypatch.setattr(update, "UPDATE_DIR", tmp_path / "data" / "update")
    calls = tmp_path / "calls"
    calls.write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_ins = {
        "rauc": f"""echo "rauc $*" >>{calls}
case "$1" in
install)
    if grep -q refused "$2"; then
        echo "installing $2: started"
        echo "LastError: signature verification failed: certificate not trusted" >&2
        echo "Installing $2 failed" >&2
        exit 1
    fi
    echo "  0% Installing"
    echo "100% Installing done."
    ;;
status) echo "RAUC_BOOT_PRIMARY='rootfs.1'" ;;
esac
""",
        "systemctl": f'echo "systemctl $*" >>{calls}\n',
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


class Server:
    """A loopback HTTP server of one file, optionally cut short."""

    def __init__(self, body: bytes, claimed: int | None = None) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/ledge.raucb":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(outer.claimed))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.body = body
        self.claimed = len(body) if claimed is None else claimed
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/ledge.raucb"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(BUNDLE)
    yield s
    s.close()


def test_a_file_is_installed_then_tried_by_a_tryboot(
    device: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "ledge.raucb"
    bundle.write_bytes(BUNDLE)
    assert main(["update", str(bundle)]) == 0
    assert device.read_text().splitlines() == [
        f"rauc install {bundle}",
        "rauc status --output-format=shell",
        "systemctl reboot 0 tryboot",
    ]
    err = capsys.readouterr().err
    assert "rauc: 100% Installing done." in err  # RAUC's progress, passed on
    assert "installed into slot B; rebooting to try it" in err


def test_a_url_is_downloaded_onto_the_data_partition_first(
    device: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["update", "--no-reboot", server.url]) == 0
    target = update.UPDATE_DIR / "download.raucb"
    assert target.read_bytes() == BUNDLE
    assert device.read_text().splitlines() == [
        f"rauc install {target}",
        "rauc status --output-format=shell",
    ]  # --no-reboot: no systemctl
    err = capsys.readouterr().err
    assert "downloaded 0.2 MiB of 0.6 MiB" in err or "of 0.6 MiB (" in err
    assert f"downloaded 0.6 MiB from {server.url}" in err
    assert "`systemctl reboot '0 tryboot'` tries it" in err


def test_a_refused_bundle_is_said_with_rauc_s_reason_and_nothing_reboots(
    device: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = tmp_path / "refused.raucb"
    bundle.write_text("refused")
    assert main(["update", str(bundle)]) == 1
    assert "systemctl" not in device.read_text()
    err = capsys.readouterr().err
    assert (
        "ledge update: not installed: signature verification failed: "
        "certificate not trusted\n" in err
    )


def test_a_download_that_stops_short_or_cannot_fit_is_not_installed(
    device: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    short = Server(BUNDLE, claimed=len(BUNDLE) + 1000)
    try:
        assert main(["update", short.url]) == 1
    finally:
        short.close()
    err = capsys.readouterr().err
    assert f"the download ended after {len(BUNDLE)} of {len(BUNDLE) + 1000} bytes" in err
    assert device.read_text() == ""  # RAUC never asked
    assert not list(update.UPDATE_DIR.iterdir())  # no partial file left

    # The data partition holds the store: a bundle that would leave less than KEEP_FREE
    # is refused before a byte is written.
    free = shutil.disk_usage(update.UPDATE_DIR).free
    monkeypatch.setattr(update, "KEEP_FREE", free - len(BUNDLE) // 2)
    big = Server(BUNDLE)
    try:
        assert main(["update", big.url]) == 1
    finally:
        big.close()
    err = capsys.readouterr().err
    assert "0.6 MiB does not fit on the data partition" in err
    assert device.read_text() == ""
    assert not list(update.UPDATE_DIR.iterdir())


def test_without_slots_or_a_bundle_it_says_what_is_wrong(
    device: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["update", str(tmp_path / "missing.raucb")]) == 1
    assert f"not installed: {tmp_path}/missing.raucb: no such file" in capsys.readouterr().err
    assert main(["update", "http://127.0.0.1:9/ledge.raucb"]) == 1
    assert (
        "not installed: http://127.0.0.1:9/ledge.raucb: <urlopen error" in capsys.readouterr().err
    )
    monkeypatch.setattr(update, "RAUC_CONF", tmp_path / "absent.conf")
    assert main(["update", str(tmp_path / "missing.raucb")]) == 2
    assert "this system has no update slots" in capsys.readouterr().err
    assert device.read_text() == ""


def test_the_command_is_listed_with_its_help() -> None:
    parser = argparse.ArgumentParser(prog="ledge")
    update.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["update", "--no-reboot", "x.raucb"])
    assert (args.bundle, args.no_reboot) == ("x.raucb", True)
