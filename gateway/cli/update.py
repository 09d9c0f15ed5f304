"""``ledge update BUNDLE``: a new system for the SD-card image, tried once and kept only if
the gateway is healthy.

On a card made by ``image/build`` (two system slots and a data partition), it installs a
signed RAUC bundle (a file, or an ``http(s)`` URL downloaded first onto the data
partition) into the slot not running, then reboots with ``reboot '0 tryboot'``: the
Raspberry Pi firmware starts the new system for that one boot. There,
``ledge-update-commit`` keeps it only when ``ledge health --wait`` passes (listeners
answer, bridges connected, sensors heard, within ``health.timeout``); otherwise, and
when the new system never gets that far (it does not boot, hangs until the watchdog
resets it, or loses power), the next boot is the old system, and the outcome is kept in
``/data/update/last``.

RAUC checks the bundle's signature against the certificates the image was built with
(``/etc/rauc/keyring.pem``) and its compatibility before it writes anything.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
#: Where the data partition keeps a downloaded bundle and the outcome of the last update.
UPDATE_DIR = Path(os.environ.get("LEDGE_UPDATE_DIR", "/data/update"))
RAUC_CONF = Path(os.environ.get("LEDGE_RAUC_CONF", "/etc/rauc/system.conf"))
#: Left free on the data partition by a download: the store lives there.
KEEP_FREE = 64 * 1024 * 1024
CHUNK = 256 * 1024


class UpdateError(Exception):
    """Why an update did not happen (said on standard error, exit 1)."""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "update",
        help="install a signed system update bundle, try it once, keep it if healthy",
        description="On the Ledge SD-card image: install the signed update bundle BUNDLE "
        "(a file, or an http(s) URL, downloaded onto the data partition first) into the "
        "system slot not running, and reboot into it once (reboot '0 tryboot'). The new "
        "system is kept only when the gateway is healthy by `ledge health --wait` "
        "(within health.timeout); otherwise, or if it never comes up, the device goes "
        "back to the system it runs now. The store, the journal, the SSH host keys and "
        "the configuration are kept either way. Exit 0 when installed (and rebooting), "
        "1 when the bundle was refused or could not be installed, 2 when this system "
        "has no update slots.",
    )
    parser.add_argument("bundle", metavar="BUNDLE", help="a .raucb file or an http(s) URL")
    parser.add_argument(
        "--no-reboot",
        action="store_true",
        help="install only; the new system is tried at the next `systemctl reboot '0 tryboot'`",
    )


def main(args: argparse.Namespace) -> int:
    if not RAUC_CONF.is_file():
        print(
            f"ledge update: this system has no update slots ({RAUC_CONF} is missing): "
            "system updates are for the Ledge SD-card image; elsewhere, update Ledge "
            "with pip or your fleet tool",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        bundle = _fetch(args.bundle, sys.stderr)
        slot = _install(bundle, sys.stderr)
    except UpdateError as exc:
        print(f"ledge update: not installed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.no_reboot:
        print(
            f"ledge update: installed into slot {slot}; `systemctl reboot '0 tryboot'` "
            "tries it (kept only if the gateway is healthy)",
            file=sys.stderr,
        )
        return EXIT_OK
    print(
        f"ledge update: installed into slot {slot}; rebooting to try it (kept only if "
        "the gateway is healthy within health.timeout, else back to this system)",
        file=sys.stderr,
    )
    subprocess.run(["systemctl", "reboot", "0 tryboot"], check=False)
    return EXIT_OK


def _fetch(source: str, progress: IO[str]) -> Path:
    """The bundle as a local file: ``source`` itself, or downloaded from an http(s) URL
    into ``UPDATE_DIR`` (never filling the data partition: the store lives there)."""
    if not source.startswith(("http://", "https://")):
        path = Path(source)
        if not path.is_file():
            raise UpdateError(f"{source}: no such file")
        return path.resolve()
    UPDATE_DIR.mkdir(parents=True, exist_ok=True)
    target = UPDATE_DIR / "download.raucb"
    partial = target.with_suffix(".part")
    try:
        with urllib.request.urlopen(source, timeout=30) as response:
            total = int(response.headers.get("Content-Length") or 0)
            room = shutil.disk_usage(UPDATE_DIR).free - KEEP_FREE
            if total > room:
                raise UpdateError(
                    f"{source}: {_mib(total)} does not fit on the data partition "
                    f"({_mib(room)} may be used, {_mib(KEEP_FREE)} stay free for the store)"
                )
            done = 0
            shown = 0.0
            with partial.open("wb") as out:
                while chunk := response.read(CHUNK):
                    done += len(chunk)
                    if done > room:
                        raise UpdateError(
                            f"{source}: more than the {_mib(room)} the data partition can take"
                        )
                    out.write(chunk)
                    now = time.monotonic()
                    if now - shown >= 1.0:
                        shown = now
                        of = f" of {_mib(total)} ({100 * done // total} %)" if total else ""
                        print(f"ledge update: downloaded {_mib(done)}{of}", file=progress)
                out.flush()
                os.fsync(out.fileno())
        if total and done != total:
            raise UpdateError(f"{source}: the download ended after {done} of {total} bytes")
    except (urllib.error.URLError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise UpdateError(f"{source}: {exc}") from None
    except UpdateError:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    print(f"ledge update: downloaded {_mib(done)} from {source}", file=progress)
    return target


def _install(bundle: Path, progress: IO[str]) -> str:
    """``rauc install``, its progress passed on; the slot it wrote (A or B)."""
    said: list[str] = []
    with subprocess.Popen(
        ["rauc", "install", str(bundle)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip()
            said.append(line)
            print(f"rauc: {line}", file=progress)
    if proc.returncode != 0:
        # RAUC says why on its "LastError:" line; the lines after it only say it failed.
        errors = [s.split("LastError:", 1)[1].strip() for s in said if "LastError:" in s]
        lines = [s for s in said if s.strip()]
        raise UpdateError(
            errors[-1] if errors else lines[-1] if lines else f"rauc exited {proc.returncode}"
        )
    slot = subprocess.run(
        ["rauc", "status", "--output-format=shell"], capture_output=True, text=True, check=False
    )
    for line in slot.stdout.splitlines():
        if line.startswith("RAUC_BOOT_PRIMARY="):
            primary = line.split("=", 1)[1].strip("'\"")
            return {"rootfs.0": "A", "rootfs.1": "B"}.get(primary, primary)
    return "not running now"


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"
