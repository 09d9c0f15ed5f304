"""``ledge-pipeline``: land, prepare, silver, gold, run, backfill, stream, report.

Every Spark command takes ``--root URI`` (where the tables live), ``--master`` (default:
embedded ``local[*]``, or spark-submit's when run under it) and ``--conf key=value``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from drivers.model import DEFAULT_PREFIX
from pipeline.config import PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("pipeline")
DEFAULTS = PipelineConfig()


N = TypeVar("N", int, float)


def _positive(kind: Callable[[str], N]) -> Callable[[str], N]:
    def parse(text: str) -> N:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} is not a positive number")
        return value

    return parse


def _rules(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("rules (changing one changes the tables: backfill)")
    g.add_argument("--prefix", default=DEFAULTS.prefix, help="topic prefix (default: %(default)s)")
    g.add_argument(
        "--horizon",
        type=int,
        default=DEFAULTS.horizon_days,
        metavar="DAYS",
        help="late-data horizon: messages arriving more days than this after their "
        "timestamp's day are quarantined; each run recomputes this many days back "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--future-tolerance",
        type=float,
        default=DEFAULTS.future_tolerance.total_seconds(),
        metavar="SECONDS",
        help="timestamps later than the receive time by more are implausible "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--gap",
        type=_positive(float),
        default=DEFAULTS.gap.total_seconds(),
        metavar="SECONDS",
        help="a sensor silent longer than this has a gap (default: %(default)s)",
    )


def _spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        required=True,
        metavar="URI",
        help="where the tables live: a path, file:///..., hdfs://..., s3a://...",
    )
    g = parser.add_argument_group("spark")
    g.add_argument(
        "--master",
        metavar="M",
        help="Spark master: local[N], spark://host:7077, yarn, k8s://... "
        "(default: local[*], or spark-submit's)",
    )
    g.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)",
    )
    g.add_argument("--quiet", action="store_true", help="no progress display on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ledge-pipeline",
        description="Ledge's cloud pipeline: land the telemetry the gateways mirror, then "
        "turn it into deduplicated silver tables and gold aggregates with Spark.",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="(default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    land = sub.add_parser(
        "land",
        help="subscribe to the cloud broker and write what arrives to landing files",
        description="Subscribe with a persistent QoS 1 session and write every message as a "
        "JSON line; finished files are renamed into <root>/landing/date=YYYY-MM-DD/hour=HH/. "
        "Messages are acknowledged only once fsynced: a crash may land a message twice "
        "(silver deduplicates), never lose one. Stops cleanly on SIGINT/SIGTERM.",
    )
    land.add_argument(
        "--broker",
        required=True,
        metavar="URL",
        help="mqtt://[user[:password]@]host[:port] or mqtts://... (TLS)",
    )
    land.add_argument(
        "--topic",
        action="append",
        metavar="FILTER",
        help=f"topic filter to subscribe to (repeatable; default: {DEFAULT_PREFIX}/#)",
    )
    land.add_argument("--root", required=True, type=Path, help="local directory of the tables")
    land.add_argument(
        "--client-id",
        default="ledge-lander",
        help="MQTT client id: the persistent session's name; one per lander (default: %(default)s)",
    )
    land.add_argument(
        "--mqtt",
        choices=["5", "3.1.1"],
        default="5",
        help="protocol version (5 carries the bridge's user properties; default: %(default)s)",
    )
    land.add_argument(
        "--session-expiry",
        type=_positive(int),
        default=7 * 24 * 3600,
        metavar="SECONDS",
        help="how long the broker keeps the session while the lander is away "
        "(MQTT 5; default: %(default)s)",
    )
    land.add_argument(
        "--receive-maximum",
        type=_positive(int),
        default=1000,
        metavar="N",
        help="unacknowledged messages in flight to the lander, and the largest batch "
        "per fsync (default: %(default)s)",
    )
    land.add_argument(
        "--max-file-bytes",
        type=_positive(int),
        default=64 * 1024 * 1024,
        metavar="BYTES",
        help="finish a landing file at this size (default: %(default)s)",
    )
    land.add_argument(
        "--max-file-age",
        type=_positive(float),
        default=60.0,
        metavar="SECONDS",
        help="finish a landing file this long after it was opened (default: %(default)s)",
    )

    prep = sub.add_parser(
        "prepare",
        help="write the JVM class archive that makes local runs start sooner",
        description="Write the JVM class archive of this machine's Java and Spark (once, "
        "and again after upgrading either): every later session on a local master maps "
        "Spark's classes from it instead of loading them, and starts seconds sooner. "
        "Takes under a minute; does nothing when the archive exists. The archive is kept "
        "in $LEDGE_PIPELINE_CACHE, else $XDG_CACHE_HOME/ledge-pipeline (~/.cache).",
    )
    prep.add_argument("--force", action="store_true", help="write it again even if it exists")

    descriptions = {
        "silver": "Landing -> silver: parse with the contract's schema, open envelopes, "
        "deduplicate exactly by (gateway, sequence), flag implausible timestamps, "
        "quarantine bad input with its reason. Recomputes every day new landing files "
        "may have changed.",
        "gold": "Silver -> gold: per-sensor 1-minute and 1-hour aggregates, gaps, per-gateway "
        "hourly health. Recomputes the days silver changed since gold last ran.",
        "run": "silver, then gold.",
        "backfill": "Recompute silver and gold for a range of days from the landing files "
        "(after changing a rule, or to fold in data beyond the horizon).",
        "stream": "Structured Streaming over the landing files, availableNow: processes "
        "every file not processed yet, then stops. No watermark: a gateway's late backlog "
        "is folded in like any other data within the horizon.",
        "report": "Write an HTML page with plots of fleet health and sensor series.",
    }
    for name, text in descriptions.items():
        p = sub.add_parser(name, help=text.split(":")[0].split(".")[0], description=text)
        _spark_options(p)
        if name == "report":
            p.add_argument(
                "--out", type=Path, default=Path("report.html"), help="(default: %(default)s)"
            )
            p.add_argument(
                "--days",
                type=_positive(int),
                default=7,
                help="the last this many days of data (default: %(default)s)",
            )
            p.add_argument(
                "--max-series",
                type=_positive(int),
                default=12,
                metavar="N",
                help="sensor series to plot, the busiest first (default: %(default)s)",
            )
            continue
        _rules(p)
        if name == "backfill":
            p.add_argument(
                "--from",
                dest="first",
                required=True,
                type=date.fromisoformat,
                metavar="YYYY-MM-DD",
                help="first day to recompute (UTC)",
            )
            p.add_argument(
                "--to",
                dest="last",
                required=True,
                type=date.fromisoformat,
                metavar="YYYY-MM-DD",
                help="last day to recompute (UTC)",
            )
        if name == "stream":
            p.add_argument(
                "--max-files-per-trigger",
                type=_positive(int),
                default=1000,
                metavar="N",
                help="landing files per micro-batch (default: %(default)s)",
            )
    return parser


def config_from(args: argparse.Namespace) -> PipelineConfig:
    return PipelineConfig(
        prefix=args.prefix,
        horizon_days=args.horizon,
        future_tolerance=timedelta(seconds=args.future_tolerance),
        gap=timedelta(seconds=args.gap),
    )


def _land(args: argparse.Namespace) -> int:
    from pipeline.landing import LanderConfig, land, parse_broker

    cfg = LanderConfig(
        broker=parse_broker(args.broker),
        topics=tuple(args.topic or [f"{DEFAULT_PREFIX}/#"]),
        root=args.root,
        client_id=args.client_id,
        mqtt5=args.mqtt == "5",
        session_expiry=args.session_expiry,
        receive_maximum=args.receive_maximum,
        max_file_bytes=args.max_file_bytes,
        max_file_age=args.max_file_age,
    )

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        await land(cfg)

    with contextlib.suppress(asyncio.CancelledError):
        asyncio.run(main())
    return 0


def _spark_command(args: argparse.Namespace, spark: SparkSession) -> None:
    from pipeline import jobs
    from pipeline.storage import Layout

    layout = Layout(args.root)
    progress = not args.quiet
    if args.command == "report":
        from pipeline.report import write_report

        write_report(spark, layout, args.out, args.days, args.max_series, progress)
        return
    cfg = config_from(args)
    if args.command == "silver":
        jobs.silver(spark, layout, cfg, progress=progress)
    elif args.command == "gold":
        jobs.gold(spark, layout, cfg, progress=progress)
    elif args.command == "run":
        jobs.run(spark, layout, cfg, progress=progress)
    elif args.command == "backfill":
        jobs.backfill(spark, layout, cfg, args.first, args.last, progress=progress)
    elif args.command == "stream":
        from pipeline.stream import stream

        stream(spark, layout, cfg, args.max_files_per_trigger, progress=progress)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,  # this process is ours, also under spark-submit
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        if args.command == "land":
            return _land(args)
        if args.command == "prepare":
            from pipeline.prepare import prepare

            return prepare(args.force)
        if args.command != "report":
            config_from(args)  # refuse bad rules before starting a JVM
        from pipeline.session import build, parse_conf, stop

        spark = build(args.master, parse_conf(args.conf))
    except ValueError as exc:
        parser.exit(2, f"ledge-pipeline: {exc}\n")
    try:
        _spark_command(args, spark)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    finally:
        stop(spark)
    return 0
