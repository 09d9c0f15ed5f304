"""Generators of the manual's reference pages and the man pages (``python -m docs.gen``).

Each page is made from the source of truth it documents, so it cannot drift: the config
options from the ``option()`` declarations (through ``gateway.app.config.Config``) with the
descriptions of ``ledge.example.toml``, the metrics from ``gateway/metrics/collect.py``,
the commands from the argparse parsers of ``gateway.cli.main``, the UART framing from
``firmware-bridge/UART.md``, the landing format from ``pipeline/records.py``, and the
benchmark table and plot from ``bench/results/``. ``python -m docs.gen --check`` says which
committed file differs from what the sources make (a test runs it).
"""
