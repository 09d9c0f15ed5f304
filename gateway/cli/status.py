"""``ledge status [--watch]``: the status page's summary in a terminal.

It reads ``/api/status`` from the running gateway's HTTP listener (``[http]`` in the
config, or ``--url``), with the config's bearer token when it can read the token
file, or a user and a password from the environment. Only the standard library.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_UNREACHABLE = 1
EXIT_CONFIG = 2
#: Clear the terminal and go home (ANSI), between frames of --watch.
CLEAR = "\x1b[H\x1b[2J"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "status",
        help="the running gateway's status (clients, messages, bridges, sensors, warnings)",
        description="Print the running gateway's status: what the status page shows. It is "
        "read from the gateway's HTTP listener ([http] in the config, or --url); the "
        "config's token_file is used when readable.",
    )
    parser.add_argument("-c", "--config", type=Path, metavar="FILE", help="TOML config file")
    parser.add_argument(
        "--url", help="the gateway's HTTP listener, e.g. https://gw1.lan:9883 (default: config)"
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=2.0,
        metavar="SECONDS",
        help="print again every SECONDS (default 2) until interrupted",
    )
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")
    parser.add_argument("--user", help="user name (HTTP Basic, http.password_file)")
    parser.add_argument(
        "--password-env",
        metavar="VAR",
        help="environment variable holding the password (never on the command line)",
    )
    parser.add_argument("--token-file", type=Path, metavar="FILE", help="bearer token file")
    parser.add_argument(
        "--cafile", type=Path, metavar="FILE", help="CA that signs the gateway's certificate"
    )


class StatusError(Exception):
    """What to tell the user, and the exit code."""

    def __init__(self, message: str, code: int = EXIT_UNREACHABLE) -> None:
        super().__init__(message)
        self.code = code


def main(args: argparse.Namespace) -> int:
    try:
        url, headers, context = _target(args)
    except StatusError as exc:
        print(f"ledge status: {exc}", file=sys.stderr)
        return exc.code
    if args.watch is None:
        try:
            doc = fetch(url, headers, context)
        except StatusError as exc:
            print(f"ledge status: {exc}", file=sys.stderr)
            return exc.code
        print(
            json.dumps(doc, indent=2) if args.json else _text(doc),
            end="" if not args.json else "\n",
        )
        return EXIT_OK
    try:
        while True:
            try:
                doc = fetch(url, headers, context)
                frame = json.dumps(doc, indent=2) + "\n" if args.json else _text(doc)
            except StatusError as exc:
                frame = f"ledge status: {exc}\n"
            sys.stdout.write(CLEAR + frame)
            sys.stdout.flush()
            time.sleep(max(0.1, args.watch))
    except KeyboardInterrupt:
        return EXIT_OK


def _text(doc: dict[str, Any]) -> str:
    from gateway.metrics.page import render_text

    return render_text(doc)


def fetch(url: str, headers: dict[str, str], context: ssl.SSLContext | None) -> dict[str, Any]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            doc: dict[str, Any] = json.load(response)
            return doc
    except urllib.error.HTTPError as exc:
        hint = ""
        if exc.code == 401:
            hint = " (give --token-file, or --user and --password-env)"
        raise StatusError(f"{url}: HTTP {exc.code} {exc.reason}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatusError(f"cannot read {url}: {reason} (is the gateway running?)") from None


def _target(args: argparse.Namespace) -> tuple[str, dict[str, str], ssl.SSLContext | None]:
    """The URL of /api/status, the request's headers and the TLS context."""
    headers = {"Accept": "application/json"}
    token_file: Path | None = args.token_file
    pinned: str | None = None
    url = args.url
    if url is None:
        from gateway.app.config import Config, load_config
        from gateway.app.runtime import ConfigError

        try:
            config = Config() if args.config is None else load_config(args.config)
        except ConfigError as exc:
            raise StatusError(str(exc), EXIT_CONFIG) from None
        http = config.to_runtime().http
        if http is None or not http.enabled:
            where = args.config or "the default config"
            raise StatusError(
                f"the HTTP listener is not enabled in {where}: set [http] enabled = true "
                "(or give --url)",
                EXIT_CONFIG,
            )
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(http.host, http.host)
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if http.https else "http"
        url = f"{scheme}://{host}:{http.port}"
        if (
            token_file is None
            and http.token_file is not None
            and os.access(http.token_file, os.R_OK)
        ):
            token_file = Path(http.token_file)
        if http.certfile is not None and args.cafile is None:
            pinned = http.certfile
    url = url.rstrip("/")
    if not url.endswith("/api/status"):
        url += "/api/status"
    if token_file is not None:
        from gateway.net.http import read_token

        try:
            headers["Authorization"] = f"Bearer {read_token(token_file)}"
        except OSError as exc:
            raise StatusError(
                f"--token-file {token_file}: {exc.strerror or exc}", EXIT_CONFIG
            ) from None
    elif args.user is not None:
        password = os.environ.get(args.password_env or "", "")
        if args.password_env and args.password_env not in os.environ:
            raise StatusError(f"environment variable {args.password_env} is not set", EXIT_CONFIG)
        pair = base64.b64encode(f"{args.user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    context = None
    if url.startswith("https:"):
        if pinned is not None:
            # The gateway's own certificate, read from its config, is trusted as it is
            # and nothing else is (a pin), whatever name it was issued for.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.load_verify_locations(pinned)
            context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        else:
            cafile = None if args.cafile is None else str(args.cafile)
            context = ssl.create_default_context(cafile=cafile)
    return url, headers, context
