"""The agent side: dial out to the hub and keep a session up, for as long as the agent runs.

* The hub is verified against the configured CA only: the caller's SSL context factory is
  pinned (``certs.tls.client_context``), and we insist on TLS 1.3 and our ALPN.
* Reconnects wait an exponential delay with full jitter, reset after a stable session; a hub
  that says it is busy (or drops or times out the dial) makes the delay start at seconds, not
  tenths (``tunnel.backoff``), so a fleet redialling one hub spreads out.
* Nothing polls (issue 22: one process may hold thousands of agents' sessions): a dialer sleeps
  until its session ends or is drained, the hub's SETTINGS change its instances, or the loop's
  one certificate watch (every ``ROTATION_CHECK_INTERVAL``, once per distinct context factory)
  sees a new context.
* GOAWAY from the hub (it is shutting down or shedding load): a new session is dialled for new
  streams while the old one finishes its in-flight streams.
* Certificate rotation: when the context factory hands out a new context (files changed on
  disk), a new session is opened with it, and only once the hub has accepted it is the old
  one drained (the old one keeps taking streams meanwhile, so renewal fails no request).
* ``drain(deadline)`` (SIGTERM): DRAIN to the hub, in-flight streams finish up to the deadline.
* Through an egress proxy (``proxy``, from ``HTTPS_PROXY``/``NO_PROXY`` via
  :func:`tunnel.proxy.proxy_for`): HTTP CONNECT to the hub, then the same TLS inside it. A
  proxy that refuses is logged once a minute per distinct answer, like a hub that refuses.

Several hub processes may share one address (gateway workers, hub replicas behind a Service);
each serves only the agents that hold a session to it. :class:`HubFanout` keeps one session to
each: the hub's SETTINGS name its instance and either the live instances (HUB_PEER, from the
hub's Leases; the union of what every session announces) or only how many there are; a dial
that reaches an instance already served is drained and redialled after a short random delay
(connections are spread by the kernel or the load balancer): free redials for as many dials as
a uniform balancer needs to reach a missing instance, then a growing delay (the rule, and why a
listed set earns more free redials than a bare count, is in :mod:`tunnel.redial`), dialers are
added until every instance has one and removed when there are fewer instances, and
a session to an instance that the other instances have stopped listing for ``GONE_AFTER`` is
drained (its process is gone from the hub but its connection lingers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
import weakref
from collections.abc import Callable

from tunnel.backoff import Backoff
from tunnel.connection import ALPN, OpenRequest, SessionConfig, StreamProtocol, TunnelSession
from tunnel.handshake import AGENT_HANDSHAKE_TIMEOUT, LogThrottle, describe_hub_refusal, hub_busy
from tunnel.proxy import ProxyConfig, ProxyError, open_through_proxy
from tunnel.redial import RedialBackoff, Search

log = logging.getLogger("hubproxy.tunnel")

OnOpen = Callable[[OpenRequest], StreamProtocol | None]
ContextFactory = Callable[[], ssl.SSLContext]
ROTATION_CHECK_INTERVAL = 2.0  # how often the loop asks each context factory for a new context
# A TCP connect gets this long: when the hub's listen queue is full the kernel drops SYNs, and
# the retransmissions would otherwise keep a dial waiting for minutes.
CONNECT_TIMEOUT = 10.0
ROTATION_OVERLAP = 1.0  # seconds the rotated session stays usable beside its successor
OLD_SESSION_DEADLINE = 300.0  # how long a replaced session may keep its in-flight streams
SETTINGS_TIMEOUT = 5.0  # a hub that sends no SETTINGS by then is taken as a single instance
REFUSAL_LOG_INTERVAL = 60.0  # the same refusal is logged at WARNING at most this often
# A session's instance that no other session has listed for this long is gone. Longer than a
# Lease (15 s) plus a listing period, so an instance that just started is listed first.
GONE_AFTER = 20.0


class AgentDialer:
    def __init__(
        self,
        hub_host: str,
        hub_port: int,
        ssl_context_factory: Callable[[], ssl.SSLContext],
        on_open: OnOpen,
        config: SessionConfig | None = None,
        server_hostname: str | None = None,
        *,
        backoff: Backoff | None = None,
        handshake_timeout: float = AGENT_HANDSHAKE_TIMEOUT,
        fanout: HubFanout | None = None,
        proxy: ProxyConfig | None = None,
    ) -> None:
        self.hub_host = hub_host
        self.proxy = proxy
        self.hub_port = hub_port
        self.ssl_context_factory = ssl_context_factory
        self.on_open = on_open
        self.config = config or SessionConfig()
        self.server_hostname = server_hostname or hub_host
        self.backoff = backoff or Backoff()
        self.handshake_timeout = handshake_timeout
        self.session: TunnelSession | None = None
        self.retiring: set[TunnelSession] = set()
        self.connects = 0
        self.fanout = fanout
        self._stopping = asyncio.Event()
        self._caching_factory = False
        self._refusals = LogThrottle(REFUSAL_LOG_INTERVAL)
        self.last_refusal: str | None = None  # why the hub last refused us (None once accepted)
        self._rotated: TunnelSession | None = None  # replaced certificate, successor not up
        self._wakeup: asyncio.Future[None] | None = None  # set: look at the session again
        self._busy = False  # the last dial failed because the hub is busy

    @property
    def connected(self) -> bool:
        return self.session is not None and not self.session.closed and not self.session.draining

    async def run(self) -> None:
        """Keep one usable session to the hub until ``drain`` is called."""
        # A session whose certificate was rotated (self._rotated) keeps serving until its
        # successor is up (the hub has registered it): no request finds no session.
        while not self._stopping.is_set():
            context = self.ssl_context_factory()
            # A factory that hands out the same context until its files change (ReloadingContext)
            # tells us about rotation by handing out a new one; one that builds anew every call
            # cannot, and must not look like a rotation every half second.
            self._caching_factory = self.ssl_context_factory() is context
            session = await self._connect(context)
            if session is None:
                # Not replaced yet: the rotated session keeps serving until it ends.
                rotated: TunnelSession | None = self._rotated
                if rotated is not None and (rotated.closed or rotated.draining):
                    self._rotated = None
                await self._sleep(self.backoff.next_delay(overloaded=self._busy))
                continue
            if self.fanout is not None and not await self.fanout.admit(self, session):
                # The hub may already route a stream here: drain (no new streams, the hub
                # stops picking it) rather than close under a request.
                log.debug("hub instance %d already has a session: draining this one",
                          session.hub_instance)
                self._retire(session)
                if self.fanout.surplus(self):
                    return  # the hub has fewer instances than we have dialers
                await self._sleep(self.fanout.redial_delay())
                continue
            if self._rotated is not None:
                # A moment of overlap: the hub sends new streams to the newest of equally
                # loaded sessions, so few OPENs are in flight on the old one when it drains
                # (an OPEN crossing the DRAIN is refused SHUTTING_DOWN, PROTOCOL.md section 9).
                old = self._rotated
                asyncio.get_running_loop().call_later(ROTATION_OVERLAP, self._retire, old)
                self._rotated = None
            self.session = session
            self.backoff.connected(time.monotonic())
            reason = await self._watch(session, context)
            self.session = None
            if self.fanout is not None:
                self.fanout.release(self, session)
            self.backoff.disconnected(time.monotonic())
            if reason == "closed":
                log.warning("hub session ended: %s", session.close_reason or "closed")
                await self._sleep(self.backoff.next_delay())
            elif reason == "certificate rotated":  # drained once the new one is up
                log.info("replacing the hub session (%s)", reason)
                self._rotated = session  # (the previous one was retired when this one came up)
            else:  # goaway: dial again at once, let the old one finish
                log.info("replacing the hub session (%s)", reason)
                self._retire(session)

    async def _connect(self, context: ssl.SSLContext) -> TunnelSession | None:
        loop = asyncio.get_running_loop()
        self._busy = False
        # Through a proxy: a socket already tunnelled to the hub; TLS runs inside it.
        sock: socket.socket | None = None
        if self.proxy is not None:
            try:
                sock = await open_through_proxy(
                    self.proxy, self.hub_host, self.hub_port, self.handshake_timeout)
            except ProxyError as exc:
                allowed, suppressed = self._refusals.allow(str(exc))
                log.log(logging.WARNING if allowed else logging.DEBUG,
                        "cannot reach the hub %s:%d through the proxy %s: %s; retrying with "
                        "backoff%s", self.hub_host, self.hub_port, self.proxy.display, exc,
                        f" ({suppressed} more since the last such line)" if suppressed else "")
                return None

        def make_session() -> TunnelSession:
            return TunnelSession(config=self.config, on_open=self.on_open, name="hub")

        try:
            async with asyncio.timeout(CONNECT_TIMEOUT + self.handshake_timeout):
                if sock is not None:
                    transport, session = await loop.create_connection(
                        make_session, sock=sock, ssl=context,
                        server_hostname=self.server_hostname,
                        ssl_handshake_timeout=self.handshake_timeout)
                else:
                    transport, session = await loop.create_connection(
                        make_session, self.hub_host, self.hub_port, ssl=context,
                        server_hostname=self.server_hostname,
                        ssl_handshake_timeout=self.handshake_timeout)
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            self._busy = hub_busy(exc)
            why = describe_hub_refusal(exc, None) if self._busy else None
            log.warning(
                "cannot connect to the hub %s:%d: %s",
                self.hub_host,
                self.hub_port,
                why
                or getattr(exc, "reason", None)
                or getattr(exc, "strerror", None)
                or type(exc).__name__,
            )
            return None
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.version() != "TLSv1.3" or (
            ssl_object.selected_alpn_protocol() != ALPN
        ):
            log.warning("hub %s:%d did not negotiate TLS 1.3 with ALPN %s; disconnecting",
                        self.hub_host, self.hub_port, ALPN)
            session.close("hub protocol mismatch")
            return None
        if not await self._accepted(session):
            return None
        self.connects += 1
        self.last_refusal = None
        log.info("connected to the hub %s:%d", self.hub_host, self.hub_port)
        return session

    async def _accepted(self, session: TunnelSession) -> bool:
        """Did the hub accept this session? Its SETTINGS say yes; an end before them says no.

        With TLS 1.3 our handshake completes before the hub has checked our certificate, so a
        refusal (expired, unknown CA, no cluster named) arrives only now, as a TLS alert or a
        GOAWAY: logged once with the hub's reason, then at most every REFUSAL_LOG_INTERVAL.
        A hub that sends no SETTINGS in time but keeps the session is taken as accepting.
        A hub refuses *instead of* sending SETTINGS, so once they arrived the hub accepted
        us, even if the session has ended since (a hub shutting down just after accepting):
        that end is the session's, reported as such by the caller, not a refusal.
        """
        settings = asyncio.ensure_future(session.wait_peer_settings(SETTINGS_TIMEOUT))
        closed = asyncio.ensure_future(session.wait_closed())
        try:
            await asyncio.wait({settings, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            settings.cancel()
            closed.cancel()
        refused = not session.peer_settings_received and (
            session.closed or session.goaway_message is not None)
        if not refused:
            return True
        session.close("refused by the hub")
        # The hub dropped the session before its checks (its handshake timed out, busy): back
        # off as from a busy hub. A refusal it explains (a GOAWAY, a certificate alert) is not.
        error = session.connection_error
        self._busy = (session.goaway_message is None and error is not None and hub_busy(error)
                      and describe_hub_refusal(error, None) is None)
        why = (describe_hub_refusal(session.connection_error, session.goaway_message)
               or f"the hub ended the session at once ({session.close_reason or 'closed'})")
        self.last_refusal = why
        allowed, suppressed = self._refusals.allow(why)
        log.log(logging.WARNING if allowed else logging.DEBUG,
                "the hub %s:%d refused this agent: %s; retrying with backoff%s", self.hub_host,
                self.hub_port, why, f" ({suppressed} more since the last such line)"
                if suppressed else "")
        return False

    async def _watch(self, session: TunnelSession, context: ssl.SSLContext) -> str:
        """Why this session stops being the one for new streams. Sleeps until something that
        could change the answer happens (see the module docstring), never on a timer."""
        loop = asyncio.get_running_loop()
        session.on_closed.append(self._wake)
        session.on_peer_draining.append(self._wake)
        rotation = _rotation_watch(loop) if self._caching_factory else None
        if rotation is not None:
            rotation.add(self, self.ssl_context_factory, context)
        if self.fanout is not None:
            self.fanout.watch(session)
        try:
            while True:
                reason = self._replaced_because(session, context)
                if reason is not None:
                    return reason
                self._wakeup = loop.create_future()
                await self._wakeup
        finally:
            self._wakeup = None
            _discard(session.on_closed, self._wake)
            _discard(session.on_peer_draining, self._wake)
            if rotation is not None:
                rotation.discard(self, self.ssl_context_factory)
            if self.fanout is not None:
                self.fanout.unwatch(session)

    def _replaced_because(self, session: TunnelSession, context: ssl.SSLContext) -> str | None:
        if session.closed:
            return "closed"
        if self._stopping.is_set():
            return "stopping"
        if session.draining:
            return "hub sent GOAWAY"
        if self._caching_factory and self.ssl_context_factory() is not context:
            return "certificate rotated"
        if self.fanout is not None and self.fanout.gone(self, session):
            return f"hub instance {session.hub_instance} is gone"
        return None

    def _wake(self, *_: object) -> None:
        """Something changed: :meth:`_watch` looks at the session again."""
        if self._wakeup is not None and not self._wakeup.done():
            self._wakeup.set_result(None)

    def _retire(self, session: TunnelSession) -> None:
        if session.closed:
            return
        self.retiring.add(session)

        async def finish() -> None:
            try:
                await session.drain(OLD_SESSION_DEADLINE)
            finally:
                self.retiring.discard(session)

        asyncio.get_running_loop().create_task(finish())

    async def _sleep(self, delay: float) -> None:
        # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that arrives
        # in the turn the event is set.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._stopping.wait()

    async def drain(self, deadline: float) -> None:
        """Stop reconnecting; DRAIN every session and wait up to ``deadline`` for its streams."""
        self._stopping.set()
        self._wake()
        sessions = [s for s in (self.session, self._rotated, *self.retiring)
                    if s is not None and not s.closed]
        await asyncio.gather(*(s.drain(deadline) for s in sessions), return_exceptions=True)


class HubFanout:
    """One :class:`AgentDialer` per hub instance behind the address (see the module docstring).

    ``make_dialer(fanout)`` builds a dialer that reports to this fan-out. The first dialer runs
    at once; more are added as the hub's SETTINGS announce more instances.
    """

    def __init__(self, make_dialer: Callable[[HubFanout], AgentDialer]) -> None:
        self.make_dialer = make_dialer
        self.dialers: list[AgentDialer] = []
        self.instances = 1  # as the hub last announced
        self._served: dict[int, AgentDialer] = {}
        # Instance -> since when no other session lists it (held instances only).
        self._unlisted_since: dict[int, float] = {}
        self._gone_check: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._stopping = False
        self._redial = RedialBackoff()  # shared: every dialer's dial has the same chance

    @property
    def connected(self) -> bool:
        return any(d.connected for d in self.dialers)

    @property
    def sessions(self) -> list[TunnelSession]:
        return [d.session for d in self.dialers if d.session is not None]

    @property
    def connects(self) -> int:
        return sum(d.connects for d in self.dialers)

    @property
    def last_refusal(self) -> str | None:
        """Why the hub refused the last dial of some dialer, if it did (for /readyz)."""
        return next((d.last_refusal for d in self.dialers if d.last_refusal), None)

    async def admit(self, dialer: AgentDialer, session: TunnelSession) -> bool:
        """May ``dialer`` keep ``session``? False when another dialer serves its hub instance."""
        await session.wait_peer_settings(SETTINGS_TIMEOUT)
        instance = session.hub_instance
        if instance == 0:  # a single hub process: nothing to fan out
            return True
        holder = self._served.get(instance)
        if holder is not None and holder is not dialer:
            return False
        self._served[instance] = dialer
        self.instances = self._count(session)
        self._grow()
        return True

    def _count(self, extra: TunnelSession | None = None) -> int:
        """How many instances to hold: the union of the live sets the sessions announce, or,
        from hubs that announce no set, the count in their SETTINGS."""
        sessions = [s for s in (*self.sessions, extra) if s is not None and not s.closed]
        peers = {peer for s in sessions for peer in s.hub_peers}
        if peers:
            return len(peers)
        return max((s.hub_instances for s in sessions), default=self.instances)

    def search(self) -> Search:
        """Which instances the dialers without a session are looking for."""
        sessions = [s for s in self.sessions if not s.closed]
        listed = {peer for s in sessions for peer in s.hub_peers}
        held = set(self._served)
        if listed:
            missing = frozenset(listed - held)
            return Search(len(listed | held), len(missing), True, missing)
        announced = max(self._count(), len(held))
        return Search(announced, announced - len(held), False)

    def redial_delay(self) -> float:
        """A dial reached an instance already held: how long to wait before the next one."""
        return self._redial.missed(self.search())

    def watch(self, session: TunnelSession) -> None:
        """A dialer holds ``session`` now: follow what its SETTINGS announce."""
        session.on_settings.append(self._peers_changed)
        self._peers_changed()

    def unwatch(self, session: TunnelSession) -> None:
        _discard(session.on_settings, self._peers_changed)

    def gone(self, dialer: AgentDialer, session: TunnelSession) -> bool:
        """Has no other session listed ``session``'s instance for ``GONE_AFTER``? (Its process
        left the hub while its connection lingers: drop it.)"""
        since = self._unlisted_since.get(session.hub_instance)
        return since is not None and time.monotonic() - since > GONE_AFTER

    def _peers_changed(self, *_: object) -> None:
        """A session announced instances, or one ended: follow the set (more dialers when it
        grew), note which held instances the others stopped listing, and wake the dialers
        whose instance has gone unlisted for ``GONE_AFTER``."""
        count = self._count()
        if count != self.instances:
            self.instances = count
            self._grow()
        now = time.monotonic()
        holders = [d for d in self.dialers if d.session is not None]
        unlisted: dict[int, float] = {}
        for dialer in holders:
            session = dialer.session
            assert session is not None
            instance = session.hub_instance
            others = [d.session for d in holders if d is not dialer and d.session is not None
                      and d.session.hub_peers and not d.session.draining]
            if instance and others and not any(instance in s.hub_peers for s in others):
                unlisted[instance] = self._unlisted_since.get(instance, now)
        self._unlisted_since = unlisted
        if self._gone_check is not None:
            self._gone_check.cancel()
            self._gone_check = None
        if unlisted:
            due = min(unlisted.values()) + GONE_AFTER
            if due < now:
                for dialer in holders:
                    dialer._wake()
            else:  # (a moment past the threshold, so that the check sees it passed)
                self._gone_check = asyncio.get_running_loop().call_later(
                    due - now + 0.05, self._peers_changed)

    def release(self, dialer: AgentDialer, session: TunnelSession) -> None:
        if self._served.get(session.hub_instance) is dialer:
            del self._served[session.hub_instance]
        self._peers_changed()

    def surplus(self, dialer: AgentDialer) -> bool:
        """Should ``dialer`` (which holds no session now) stop because the hub has fewer
        instances than dialers?"""
        self.instances = self._count()
        if len(self.dialers) > self.instances and dialer in self.dialers:
            self.dialers.remove(dialer)
            log.info("the hub has %d instance(s): one session fewer", self.instances)
            return True
        return False

    def _grow(self) -> None:
        while not self._stopping and len(self.dialers) < self.instances:
            self._start(self.make_dialer(self))
            log.info("the hub has %d instances: dialling session %d", self.instances,
                     len(self.dialers))

    def _start(self, dialer: AgentDialer) -> None:
        self.dialers.append(dialer)
        task = asyncio.get_running_loop().create_task(dialer.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._changed.set()

    async def run(self) -> None:
        """Run every dialer until :meth:`drain`; a dialer's error ends the whole fan-out."""
        if not self.dialers:
            self._start(self.make_dialer(self))
        while self._tasks:
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            done, _ = await asyncio.wait({*self._tasks, changed},
                                         return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            for task in done:
                if task is not changed and not task.cancelled() and task.exception():
                    raise task.exception()  # type: ignore[misc]
            if self._stopping and not self._tasks:
                return

    async def drain(self, deadline: float) -> None:
        self._stopping = True
        if self._gone_check is not None:
            self._gone_check.cancel()
        await asyncio.gather(*(d.drain(deadline) for d in self.dialers), return_exceptions=True)


class _RotationWatch:
    """The caching context factories of one loop's dialers, each asked once per
    ``ROTATION_CHECK_INTERVAL``: a dialer whose factory now hands out another context than its
    session's is woken (its session is then replaced). One timer per loop, not per dialer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # factory -> {dialer: the context its session was made with}
        self.watched: dict[ContextFactory, dict[AgentDialer, ssl.SSLContext]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def add(self, dialer: AgentDialer, factory: ContextFactory, context: ssl.SSLContext) -> None:
        self.watched.setdefault(factory, {})[dialer] = context
        if self._timer is None:
            self._timer = self.loop.call_later(ROTATION_CHECK_INTERVAL, self._check)

    def discard(self, dialer: AgentDialer, factory: ContextFactory) -> None:
        dialers = self.watched.get(factory)
        if dialers is not None:
            dialers.pop(dialer, None)
            if not dialers:
                del self.watched[factory]
        if not self.watched and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        for factory, dialers in list(self.watched.items()):
            try:
                current = factory()
            except Exception:  # a broken factory keeps its sessions (they still work)
                log.exception("checking the agent certificate for a new one failed")
                continue
            for dialer, context in list(dialers.items()):
                if current is not context:
                    dialer._wake()
        if self.watched:
            self._timer = self.loop.call_later(ROTATION_CHECK_INTERVAL, self._check)


_rotation_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _RotationWatch] = (
    weakref.WeakKeyDictionary())


def _rotation_watch(loop: asyncio.AbstractEventLoop) -> _RotationWatch:
    watch = _rotation_watches.get(loop)
    if watch is None:
        watch = _rotation_watches[loop] = _RotationWatch(loop)
    return watch


def _discard(callbacks: list[Callable[[TunnelSession], None]],
             callback: Callable[..., None]) -> None:
    """Remove ``callback`` from a session's callback list if it is there."""
    with contextlib.suppress(ValueError):
        callbacks.remove(callback)
