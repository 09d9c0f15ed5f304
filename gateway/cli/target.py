"""Which running gateway a subcommand talks to, and as whom: the options and their
reading, shared by the subcommands that connect to the gateway over MQTT."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from gateway.app.config import Config, parse_listen


def add_target_args(parser: argparse.ArgumentParser) -> None:
    """``-c/--config``, ``--broker``, ``--username``, ``--password-env``."""
    parser.add_argument("-c", "--config", type=Path, metavar="FILE", help="TOML config file")
    parser.add_argument(
        "--broker", metavar="HOST:PORT", help="where the gateway listens (default: from config)"
    )
    parser.add_argument("--username", help="user name, when the listener wants one")
    parser.add_argument(
        "--password-env",
        metavar="VAR",
        help="environment variable holding the password (never on the command line)",
    )


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    username: str | None
    password: str | None


def target(args: argparse.Namespace, config: Config) -> Target:
    """Where to connect: ``--broker``, else the config's first listener (on loopback
    when it listens on every address). ValueError naming ``--broker`` when it is bad."""
    if args.broker:
        try:
            host, port = parse_listen(args.broker)
        except ValueError as exc:
            raise ValueError(f"--broker: {exc}") from None
    else:
        host, port = config.listeners[0].host, config.listeners[0].port
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    password = os.environ.get(args.password_env, "") if args.password_env else None
    return Target(host, port, args.username, password)
