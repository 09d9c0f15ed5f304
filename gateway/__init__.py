"""Ledge: an edge gateway with a small-footprint MQTT broker at its heart."""

from __future__ import annotations

__version__ = "0.1.0"
