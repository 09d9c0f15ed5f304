"""Ledge's cloud-side pipeline: landing, exact deduplication, aggregates and fleet health.

Installed with the ``pipeline`` extra (PySpark and a JVM never reach a gateway). Its only
coupling to the gateway is ``drivers.model``: the ``Reading`` contract, the health report
and the bridge's upstream marks (gateway id and sequence number).
"""
