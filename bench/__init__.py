"""Ledge's benchmark: Ledge, Debian's Mosquitto (and amqtt when installed) side by side.

``python -m bench`` (or ``scripts/bench``) runs every scenario against each broker
in one invocation, alternating their order between rounds, with the broker pinned
to one core and the load generator to another, and prints medians and ratios.
See ``bench/README.md``.
"""
