"""The composition root: the one place that knows every part of the gateway.

``root`` builds the running gateway from the validated config (core -> listeners,
store, bridges, sensors, taps, metrics, the firmware bridge, in one event loop) and
owns signals, reload and shutdown; ``__main__`` is ``python -m gateway.app``, the
process ``ledge run`` execs into. The config file becomes that process's input in two
steps: ``config`` validates the TOML with pydantic (in the ``ledge`` command, or in a
short-lived child on SIGHUP) and produces ``runtime.RuntimeConfig``, plain data the
gateway process reads without ever importing pydantic. ``sdnotify`` tells systemd
when the process is ready, reloading or stopping.

This ``__init__`` imports nothing, so reading ``gateway.app.runtime`` never loads the
validator and running the gateway never loads the command line.
"""
