"""CONNECT with its Will prompts (6.2, 6.3), and the Will updates of a connection (6.4).

A CONNECT passes, in order: the connect rates (``max_connect_rate_per_address`` for
a UDP source, ``max_connect_rate`` in all), the checks of ``_check`` (protocol id,
client id, the transport's ``allow_client_ids``, an MQTT client holding the id,
``max_connecting``), a sleeping client's origin (``_asleep_elsewhere``), the clients
of its source (``pool.address_full``) and a slot in the pool (``pool.make_room``). A
client id we know resumes its session, maybe from a new address -- but a sleeping
one's only from where it connected, as its wake (``handle_sleep``). With the Will
flag the gateway asks for WILLTOPIC and WILLMSG within ``connect_timeout``; then
``_accept``: the Will must be one the client may publish, the client gets its broker
session (``ProxyClient``), CONNACK, what was in flight and what is queued. It is
unproven until it is heard from again (``pool``).
"""

from __future__ import annotations

from gateway.broker.proxy import ProxyClient
from gateway.broker.publish_policy import sys_write_refused
from gateway.mqtt.topics import topic_name_error
from gateway.mqttsn import delivery, keepalive, output, pool, sessions
from gateway.mqttsn.addresses import origin, source, where
from gateway.mqttsn.context import Context, SnClient, log
from gateway.mqttsn.errors import NotConnected, Refused
from gateway.mqttsn.packets import (
    PROTOCOL_ID,
    ConnAck,
    Connect,
    ReturnCode,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
)
from gateway.mqttsn.state import MAX_CLIENT_ID, SLEEPING_STATES, Key, State, Will


def handle_connect(ctx: Context, key: Key, packet: Connect, now: float) -> None:
    cid = packet.client_id
    st = ctx.stats
    too_fast = _rate_exceeded(ctx, key, now)
    if too_fast is not None:
        st.clients_refused_rate += 1
        raise Refused(ReturnCode.CONGESTION, cid, too_fast)
    _check(ctx, key, packet)
    sleeper = _asleep_elsewhere(ctx, key, cid)
    if sleeper is not None:
        st.wakes_refused += 1
        why = (
            f"it is asleep, connected from {sleeper.where}; from elsewhere it may"
            " connect once its sleep has run out"
        )
        raise Refused(ReturnCode.CONGESTION, cid, why)
    if pool.address_full(ctx, key, cid) and not pool.evict_unproven_at(ctx, key, cid, now):
        st.clients_refused_per_address += 1
        why = (
            f"{ctx.settings.max_clients_per_address} clients from this address already"
            " (mqttsn.max_clients_per_address)"
        )
        raise Refused(ReturnCode.CONGESTION, cid, why)
    st.connects += 1
    existing = ctx.by_id.get(cid)
    client = ctx.by_key.get(key)
    if client is not None and client is not existing:
        # Another client id at this address: the device restarted under a new id.
        sessions.lost(ctx, client, now, f"address taken over by client {cid!r}", will=False)
    if existing is not None:
        client = _resume(ctx, existing, key, packet, now)
    else:
        if not pool.make_room(ctx, cid, now):
            why = f"all {ctx.settings.max_clients} client slots held by established clients"
            raise Refused(ReturnCode.CONGESTION, cid, why)
        client = SnClient(ctx, key, cid, now)
        ctx.by_id[cid] = client
        ctx.by_key[key] = client
    client.clean = packet.clean_session
    client.duration = packet.duration
    client.last_rx = now
    if packet.will:
        if client.state is not State.CONNECTING:
            client.state = State.CONNECTING
            ctx.connecting += 1
        sessions.cancel_timers(ctx, client)
        client.timer = ctx.timers.at(now + ctx.settings.connect_timeout, _deadline, client)
        output.send(ctx, client, WillTopicReq())
        return
    if client.clean or client.state is State.CONNECTING:
        client.will = None  # 6.3: CleanSession=true, Will=false deletes the Will
    _accept(ctx, client, now)


def _rate_exceeded(ctx: Context, key: Key, now: float) -> str | None:
    """Why a CONNECT now is over ``max_connect_rate_per_address`` (UDP sources) or
    ``max_connect_rate`` (everyone), or None."""
    settings = ctx.settings
    src = source(key[1])
    if src is not None and not ctx.connect_rate_by_source.take(src, now):
        rate = settings.max_connect_rate_per_address
        return (
            f"more than {rate:g} CONNECTs a second from {src} (mqttsn.max_connect_rate_per_address)"
        )
    if not ctx.connect_rate.take(now):
        rate = settings.max_connect_rate
        return f"more than {rate:g} CONNECTs a second in all (mqttsn.max_connect_rate)"
    return None


def _check(ctx: Context, key: Key, packet: Connect) -> None:
    """``Refused`` when the CONNECT itself is not acceptable (before any slot)."""
    cid = packet.client_id
    unsupported = ReturnCode.NOT_SUPPORTED
    if packet.protocol_id != PROTOCOL_ID:
        raise Refused(unsupported, cid, f"protocol id 0x{packet.protocol_id:02x} is not 0x01")
    if not cid or len(cid) > MAX_CLIENT_ID or topic_name_error(cid) or "/" in cid:
        raise Refused(unsupported, cid, "client id must be 1-64 characters, no '/', '+', '#'")
    policy = ctx.transports.get(key[0])
    if policy is not None and policy.allow_client_ids and cid not in policy.allow_client_ids:
        raise Refused(unsupported, cid, f"client id not in {key[0]}'s allow_client_ids")
    if cid not in ctx.by_id and cid in ctx.broker.sessions:
        raise Refused(unsupported, cid, "client id in use by an MQTT client")
    if packet.will and ctx.connecting >= ctx.settings.max_connecting:
        why = f"{ctx.connecting} clients already connecting"
        raise Refused(ReturnCode.CONGESTION, cid, why)


def _asleep_elsewhere(ctx: Context, key: Key, cid: str) -> SnClient | None:
    """The client ``cid`` when it sleeps (6.14) and ``key`` is not where it connected
    from (its transport, IPv4 address or IPv6 /64, forwarder node; any port).

    Its buffered messages go only there: a CONNECT taking its session from elsewhere
    would be sent them, whatever its clean session flag (a CONNECT while asleep only
    wakes a session). MQTT-SN cannot tell a device that moved from a host naming it,
    so both wait until its sleep duration x ``keepalive_grace`` has run out (it is
    lost, its will published, a session with clean session 0 remembered), and
    ``CONGESTION`` says to try again later."""
    client = ctx.by_id.get(cid)
    if client is None or client.state not in SLEEPING_STATES or origin(key) == client.origin:
        return None
    return client


def _resume(ctx: Context, client: SnClient, key: Key, packet: Connect, now: float) -> SnClient:
    """A client id we know connects again (maybe from a new address)."""
    if client.key != key:
        if ctx.by_key.get(client.key) is client:
            log.info("client %r moves from %s to %s", client.client_id, client.where, where(key))
            del ctx.by_key[client.key]
        client.move(key)
    ctx.by_key[key] = client
    if packet.clean_session and client.state not in SLEEPING_STATES:
        # 6.3: a clean session forgets subscriptions, registrations and the Will.
        sessions.clear_session(ctx, client, now)
    return client


def _accept(ctx: Context, client: SnClient, now: float) -> None:
    """The CONNECT is complete: the client is active (CONNACK accepted), unproven
    until it is heard from again."""
    if client.will is not None and _will_refused(ctx, client, client.will.topic):
        why = f"not authorized to publish its will on {client.will.topic!r}"
        # Forgetting it ends its CONNECT, and its place in ``max_connecting``.
        raise Refused(ReturnCode.NOT_SUPPORTED, client.client_id, why, ending=client)
    if client.state is State.CONNECTING:
        ctx.connecting -= 1
    if client.proxy is None:
        client.proxy = ProxyClient(
            ctx.broker, client.client_id, client.receive, acl=ctx.acl, now=now
        )
    client.state = State.ACTIVE
    client.proven = False
    ctx.unproven.pop(client.client_id, None)
    ctx.unproven[client.client_id] = client
    sessions.cancel_timers(ctx, client)
    keepalive.arm(ctx, client, now)
    log.info(
        "client %r connected from %s (keep alive %d s, clean session %s)",
        client.client_id,
        client.where,
        client.duration,
        client.clean,
    )
    output.send(ctx, client, ConnAck(ReturnCode.ACCEPTED))
    delivery.resume(ctx, client, now)


def _will_refused(ctx: Context, client: SnClient, topic: str) -> bool:
    """``client`` may not publish its Will on ``topic`` (``$SYS``, the ACL)."""
    rules = ctx.rules(client)
    return sys_write_refused(topic, client.client_id) or (
        rules is not None and not rules.can_write(topic)
    )


def handle_willtopic(ctx: Context, key: Key, packet: WillTopic, now: float) -> None:
    client = ctx.by_key.get(key)
    if client is None or client.state is not State.CONNECTING:
        raise NotConnected
    client.last_rx = now
    if not packet.topic:
        client.will = None  # an empty WILLTOPIC: no Will (5.4.7)
        _accept(ctx, client, now)
        return
    if topic_name_error(packet.topic):
        why = f"bad will topic {packet.topic!r}"
        raise Refused(ReturnCode.NOT_SUPPORTED, client.client_id, why, ending=client)
    client.will = Will(packet.topic, packet.qos, packet.retain)
    output.send(ctx, client, WillMsgReq())


def handle_willmsg(ctx: Context, key: Key, packet: WillMsg, now: float) -> None:
    client = ctx.by_key.get(key)
    if client is None or client.state is not State.CONNECTING or client.will is None:
        raise NotConnected
    client.last_rx = now
    client.will.message = packet.message
    _accept(ctx, client, now)


def _deadline(client: SnClient, now: float) -> None:
    """``connect_timeout`` after a CONNECT with the Will flag (a plain timer function)."""
    ctx = client.ctx
    if client.state is State.CONNECTING and ctx.by_id.get(client.client_id) is client:
        log.info("client %r: CONNECT not completed in time", client.client_id)
        sessions.forget(ctx, client, now)


# ---------------------------------------------------------------- Will updates (6.4)


def handle_willtopicupd(ctx: Context, key: Key, packet: WillTopicUpd, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    if not packet.topic:
        client.will = None
        output.send(ctx, client, WillTopicResp(ReturnCode.ACCEPTED))
        return
    if topic_name_error(packet.topic) or _will_refused(ctx, client, packet.topic):
        output.send(ctx, client, WillTopicResp(ReturnCode.NOT_SUPPORTED))
        return
    message = client.will.message if client.will is not None else b""
    client.will = Will(packet.topic, packet.qos, packet.retain)
    client.will.message = message
    output.send(ctx, client, WillTopicResp(ReturnCode.ACCEPTED))


def handle_willmsgupd(ctx: Context, key: Key, packet: WillMsgUpd, now: float) -> None:
    client = sessions.connected(ctx, key, packet, now)
    if client.will is None:
        output.send(ctx, client, WillMsgResp(ReturnCode.NOT_SUPPORTED))
        return
    client.will.message = packet.message
    output.send(ctx, client, WillMsgResp(ReturnCode.ACCEPTED))
