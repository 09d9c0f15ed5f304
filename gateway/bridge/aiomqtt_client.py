"""The one adapter over aiomqtt's private paho callbacks (the bridge's client).

aiomqtt (2.x; 2.5.1 checked) keeps to itself what the bridge needs:

- every publish acknowledgement with its reason code: ``Client.publish()`` awaits the
  PUBACK/PUBCOMP but returns None, and the bridge keeps its own window of QoS 1/2
  messages in flight (it hands them to paho, not to ``publish()``, so that a slow
  remote cannot hold a task per message) -- ``on_ack(mid, reason_code)``;
- the remote's CONNACK properties (its Receive Maximum bounds that window);
- a connection lost before CONNACK (a TLS alert, a reset) fails the attempt at once
  rather than after the connect timeout;
- a socket paho closed meanwhile is not an error to log when a write is registered.

Its public API offers none of these, so they stay overrides of its private callbacks
-- here only, and ``tests/test_bridge_aiomqtt.py`` pins the aiomqtt internals they rely
on (``PRIVATE_METHODS``, ``PRIVATE_ATTRIBUTES``) and drives each path against a real
Mosquitto. pyproject.toml bounds aiomqtt to ``<3``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Final

import aiomqtt

#: aiomqtt's private methods overridden here (paho 2.x callback signatures).
PRIVATE_METHODS: Final = (
    "_on_connect",
    "_on_disconnect",
    "_on_publish",
    "_on_socket_register_write",
)
#: aiomqtt's private attributes read here.
PRIVATE_ATTRIBUTES: Final = ("_client", "_connected", "_disconnected", "_loop")


class HookedClient(aiomqtt.Client):
    """aiomqtt's client, also reporting the remote's Receive Maximum and every publish
    acknowledgement with its reason code."""

    def __init__(
        self,
        *,
        on_ack: Callable[[int, int], None],
        last_error: Callable[[], str | None],
        **kwargs: Any,
    ) -> None:
        """``on_ack(mid, reason_code)``: the remote acknowledged ``mid`` (or a QoS 0
        message was written). ``last_error()``: the socket error paho logged last, if
        any, to explain a connection lost before CONNACK."""
        super().__init__(**kwargs)
        self._on_ack = on_ack
        self._last_error = last_error
        #: The remote's Receive Maximum (CONNACK; 65535 when it sends none).
        self.receive_maximum = 65_535

    @property
    def paho(self) -> Any:
        """The paho client under aiomqtt."""
        return self._client

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any = None
    ) -> None:
        value = getattr(properties, "ReceiveMaximum", None) if properties is not None else None
        if value:
            self.receive_maximum = int(value)
        super()._on_connect(client, userdata, flags, reason_code, properties)

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any = None
    ) -> None:
        if not self._connected.done():
            # Lost before CONNACK (a TLS alert, a reset): fail the attempt now rather
            # than after the connect timeout; paho has logged the socket error.
            why = self._last_error() or str(reason_code)
            self._connected.set_exception(
                aiomqtt.MqttError(f"connection closed before CONNACK: {why}")
            )
            return
        super()._on_disconnect(client, userdata, flags, reason_code, properties)

    def _on_socket_register_write(self, client: Any, userdata: Any, sock: Any) -> None:
        # As aiomqtt does, but a socket paho closed meanwhile is not an error to log.
        def write() -> None:
            try:
                client.loop_write()
            except Exception as exc:  # the connection broke
                if not self._disconnected.done():
                    self._disconnected.set_exception(exc)

        def watch() -> None:
            with contextlib.suppress(OSError, ValueError):
                self._loop.add_writer(fileno, write)

        fileno = sock.fileno()
        if fileno >= 0:
            self._loop.call_soon_threadsafe(watch)

    def _on_publish(
        self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any
    ) -> None:
        super()._on_publish(client, userdata, mid, reason_code, properties)
        code = getattr(reason_code, "value", reason_code)
        self._on_ack(mid, int(code) if isinstance(code, int) else 0)
