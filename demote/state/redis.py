"""A state store in Redis, for several workers or hosts (extra ``demote[redis]``).

Keys (all under ``prefix``):

- ``{prefix}state:{id}``: the conversation's state, one JSON string;
- ``{prefix}lease:{id}``: its lease, ``"{token}:{holder}"`` with a ``PX`` expiry, so
  leases expire by the server's clock;
- ``{prefix}ids``: the set of conversations with state (``count``);
- ``{prefix}fence``: the store-wide fencing counter (``INCR``), which clear and delete
  never touch.

Every operation is one round trip: a single command (``get``, ``count``) or one Lua
script, atomic on the server: acquire (check, ``INCR`` the fence, set the lease, read the
state), compare-and-set (compare, check the lease, write, release), clear (tombstone and
revoke), delete, renew, release. The scripts are written once below; the sync client
(``redis.Redis``) and the native async one (``redis.asyncio.Redis``, one per event loop)
are built from the same URL and options and run the same operation descriptions.

A value at a state key that is not a state (not JSON, another schema, a key of another
type) is never guessed at: reading it raises :class:`StoreError` (acquire reads it before
writing anything, so no lease is left behind). ``clear`` repairs it with a tombstone (its
generation restarts at 1 if the stored one is unreadable) and ``delete`` removes it, so a
corrupt value never leaves a conversation stuck.

Clients have explicit socket and connect timeouts (0.5 s by default, so a call to a server
that is down or black-holed fails well within a second and the engine's breaker takes
over), retry (bounded, with jittered exponential backoff under 100 ms) on connection
errors, and health checks. A timeout is not retried: a black-holed server fails the call
after ``socket_timeout``. Every redis error becomes a
:class:`StoreError` at this boundary.

A server that cannot be reached when the store is made (refused, timed out) is not an
error: the clients connect on their first command anyway. The store is built, a warning
says so on the ``demote`` logger, and calls fail with :class:`StoreError` until the
server answers, so the engine serves those loads degraded and its breaker probes the
server back, exactly as for a server that goes down later. A server that answers with a
refusal (a wrong password, an unknown database) raises at construction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from demote._validate import count, seconds
from demote.backends.breaker import is_outage
from demote.backends.loops import PerLoop
from demote.backends.worker import Worker
from demote.errors import ArgumentTypeError, ConfigError, MissingExtraError, StoreError
from demote.records import ConversationState
from demote.state._codec import check_ttl, decode_state, encode_state, storable_id
from demote.state._ops import OpStore, StoreOp
from demote.state.base import Lease, check_holder, tombstone

__all__ = ["RedisStateStore"]

T = TypeVar("T")
logger = logging.getLogger("demote")

# KEYS: lease, state, fence. ARGV: holder, ttl in ms.
# The state is read first: a script's writes stay even if a later command fails, and a
# state key of the wrong type must not leave a lease behind that no commit can use.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local state = redis.call('GET', KEYS[2])
local token = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[1], string.format('%d', token) .. ':' .. ARGV[1], 'PX', ARGV[2])
return {token, state}
"""

# KEYS: state, ids, lease. ARGV: expected ('' for none), new, id, lease ('' for none),
# release ('1').
# Every script that writes the ids set checks its type first: a script is not rolled back
# on an error, so a wrong-typed ids key found by SADD would leave the state half written.
_CAS = """
local ids_type = redis.call('TYPE', KEYS[2])['ok']
if ids_type ~= 'set' and ids_type ~= 'none' then
  return redis.error_reply('demote: ' .. KEYS[2] .. ' is a ' .. ids_type .. ', not a set')
end
local ok = 1
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if current then ok = 0 end
elseif current ~= ARGV[1] then
  ok = 0
end
local held = false
if ARGV[4] ~= '' then
  held = redis.call('GET', KEYS[3]) == ARGV[4]
  if not held then ok = 0 end
end
if ok == 1 then
  redis.call('SET', KEYS[1], ARGV[2])
  redis.call('SADD', KEYS[2], ARGV[3])
end
if held and ARGV[5] == '1' then redis.call('DEL', KEYS[3]) end
return ok
"""

# KEYS: state, ids, lease. ARGV: tombstone JSON before and after its generation, id.
# Clear repairs whatever is at the state key (not JSON, not an object, a generation that
# is not a count, a key of another type): the generation then starts over.
_CLEAR = """
local ids_type = redis.call('TYPE', KEYS[2])['ok']
if ids_type ~= 'set' and ids_type ~= 'none' then
  return redis.error_reply('demote: ' .. KEYS[2] .. ' is a ' .. ids_type .. ', not a set')
end
local found = redis.pcall('GET', KEYS[1])
local generation = 0
if type(found) == 'string' then
  local ok, doc = pcall(cjson.decode, found)
  if ok and type(doc) == 'table' and type(doc['generation']) == 'number'
     and doc['generation'] >= 0 and doc['generation'] < 2^53
     and doc['generation'] == math.floor(doc['generation']) then
    generation = doc['generation']
  end
end
redis.call('DEL', KEYS[1])
local tomb = ARGV[1] .. string.format('%d', generation + 1) .. ARGV[2]
redis.call('SET', KEYS[1], tomb)
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('DEL', KEYS[3])
return tomb
"""

# KEYS: state, ids, lease. ARGV: id.
_DELETE = """
redis.call('DEL', KEYS[1], KEYS[3])
redis.call('SREM', KEYS[2], ARGV[1])
return 1
"""

# KEYS: lease. ARGV: lease value, ttl in ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# KEYS: lease. ARGV: lease value.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: lease. ARGV: holder. Whatever the token (a grant whose reply was lost).
_RELEASE_HOLDER = """
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^%d+:(.*)$') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_SCRIPTS = {
    "acquire": _ACQUIRE,
    "cas": _CAS,
    "clear": _CLEAR,
    "delete": _DELETE,
    "renew": _RENEW,
    "release": _RELEASE,
    "release_holder": _RELEASE_HOLDER,
}

# The tombstone's JSON around its generation: the clear script fills the number in, so
# what it writes is exactly encode_state(tombstone(...)).
_TOMB_HEAD, _TOMB_TAIL = encode_state(tombstone(None)).split('"generation":1')
_TOMB_HEAD += '"generation":'


_SCHEMES = ("redis://", "rediss://", "unix://")
#: The commands that only read (a read-only store runs no other).
_READS = frozenset({"get", "scard", "smembers"})


def _op(name: str, keys: tuple[str, ...], args: tuple[str | int, ...], finish: Any) -> StoreOp[Any]:
    """A command (``get``, ``scard``) or script (a key of ``_SCRIPTS``) and its reading."""
    return StoreOp((name, keys, args), finish)


def _lease_value(lease: Lease) -> str:
    return f"{lease.token}:{lease.holder}"


def _ms(ttl: float) -> int:
    return max(1, round(check_ttl(ttl) * 1000))


def _optional_state(raw: Any) -> ConversationState | None:
    return None if raw is None else decode_state(raw)


def _check_options(
    url: object, client: object, async_client: object, prefix: object, **options: object
) -> tuple[str, str]:
    """The URL (default: the local server) and prefix, once every option is checked."""
    if url is None:
        url = "redis://127.0.0.1:6379/0"
    if not isinstance(url, str) or not url.startswith(_SCHEMES):
        shown = type(url).__name__ if not isinstance(url, str) else "a str of another scheme"
        raise ConfigError(f"url: must be a redis URL ({', '.join(_SCHEMES)}...), got {shown}")
    for name, given in (("client", client), ("async_client", async_client)):
        if given is not None and not callable(getattr(given, "register_script", None)):
            raise ArgumentTypeError(f"{name}: must be a redis client, got {given!r:.40}")
    if not isinstance(prefix, str) or "\x00" in prefix or len(prefix) > 1024:
        raise ArgumentTypeError(f"prefix: must be a str without NUL, got {prefix!r:.40}")
    try:
        prefix.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"prefix: is not valid Unicode text: {prefix!r:.40}") from None
    for name in ("socket_timeout", "socket_connect_timeout", "health_check_interval"):
        seconds(name, options[name])
    count("retries", options["retries"], minimum=0, maximum=100)
    count("max_connections", options["max_connections"])
    return url, prefix


class RedisStateStore(OpStore):
    """Conversation states and fenced leases in Redis.

    Args:
        url: A redis URL (``redis://host:port/db``), used when ``client`` is not given.
            Both the sync client and the async ones are built from it.
        client: An existing ``redis.Redis`` client (``decode_responses`` off), used as
            is; not closed by :meth:`close`.
        async_client: An existing ``redis.asyncio.Redis`` client for the async twins,
            used as is. Without it (and without ``url``) the async twins run the sync
            client on the store's own threads.
        prefix: Prefix of every key this store writes.
        socket_timeout: Seconds to wait for a reply before the call fails. Short by
            default: every operation is one small command or script, and a load whose
            store does not answer degrades (see :mod:`demote.backends.breaker`), so the slowest
            turn during an outage costs about this.
        socket_connect_timeout: Seconds to wait for a connection.
        retries: How many times a call is retried after a connection error (backoff
            from 25 ms, capped at 100 ms, jittered), so a cut connection is replaced
            within the call. Timeouts are not retried.
        health_check_interval: A connection idle this many seconds is pinged before use.
        max_connections: Size of each client's connection pool.
        read_only: Open for reading only (what ``demote inspect`` does): every write
            raises :class:`StoreError`, and a server out of reach raises at once.

    Raises:
        StoreError: The server refused the connection for good (a wrong password, an
            unknown database); read-only: it cannot be reached. (A writable store made
            while its server is out of reach is built: see the module docstring.)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        async_client: Any = None,
        prefix: str = "demote:",
        socket_timeout: float = 0.5,
        socket_connect_timeout: float = 0.5,
        retries: int = 2,
        health_check_interval: float = 15.0,
        max_connections: int = 50,
        read_only: bool = False,
    ) -> None:
        try:
            import redis
            import redis.asyncio
            import redis.asyncio.retry
            import redis.backoff
            import redis.retry
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError("redis", "redis") from exc
        url, prefix = _check_options(
            url,
            client,
            async_client,
            prefix,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_connect_timeout,
            retries=retries,
            health_check_interval=health_check_interval,
            max_connections=max_connections,
        )
        self.prefix = prefix
        if not isinstance(read_only, bool):
            raise ArgumentTypeError(f"read_only: must be a bool, got {read_only!r:.40}")
        self.read_only = read_only
        self._ids = f"{prefix}ids"
        self._fence = f"{prefix}fence"
        self._errors: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._owns_client = client is None
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
            "health_check_interval": health_check_interval,
            "max_connections": max_connections,
        }
        driver_info = getattr(redis, "DriverInfo", None) or getattr(
            getattr(redis, "driver_info", None), "DriverInfo", None
        )
        if driver_info is not None:
            # Read once, here: otherwise redis-py reads its version from the package
            # metadata (file I/O) each time it opens a connection, on the event loop too.
            options["driver_info"] = driver_info(name="redis-py", lib_version=redis.__version__)

        def retry(module: Any) -> Any:
            backoff = redis.backoff.ExponentialWithJitterBackoff(base=0.025, cap=0.1)
            return module.Retry(backoff, retries, (redis.ConnectionError,))

        if client is None:
            try:
                client = redis.Redis.from_url(url, retry=retry(redis.retry), **options)
            except ValueError as exc:  # never echoed: a URL may carry a password
                raise ConfigError(f"url: not a usable redis URL: {exc}") from None
        self._redis = client
        self._scripts = {name: client.register_script(src) for name, src in _SCRIPTS.items()}
        self._first_ping(redis)
        self._worker: Worker | None = None
        self._async: PerLoop[tuple[Any, dict[str, Any]]] | None = None
        if async_client is not None or self._owns_client:

            async def make() -> tuple[Any, dict[str, Any]]:
                made = async_client or redis.asyncio.Redis.from_url(
                    url, retry=retry(redis.asyncio.retry), **options
                )
                return made, {name: made.register_script(s) for name, s in _SCRIPTS.items()}

            async def close(pair: tuple[Any, dict[str, Any]]) -> None:
                if async_client is None:
                    await pair[0].aclose()

            self._async = PerLoop(make, close)
        else:
            self._worker = Worker("demote-redis-state", threads=4)

    def _first_ping(self, redis: Any) -> None:
        """Check the server at construction; one out of reach is waited for, with a warning.

        The client connects on its first command anyway, so a server that is down (refused,
        timed out) now is no reason to fail: calls fail until it answers, and the engine
        serves those loads degraded. A server that answers with a refusal (a wrong
        password, an unknown database index) raises :class:`StoreError` here.
        """
        try:
            with self._translated("cannot reach redis"):
                self._redis.ping()
        except StoreError as exc:
            refused = (redis.AuthenticationError, redis.ResponseError)
            if self.read_only or isinstance(exc.__cause__, refused) or not is_outage(exc):
                raise
            logger.warning(
                "redis state store %r: %s; built without it: calls fail (loads are "
                "degraded) until it answers",
                self.prefix,
                exc,
            )

    @contextmanager
    def _translated(self, what: str = "redis") -> Iterator[None]:
        try:
            yield
        except self._errors as exc:  # redis errors become ours at this boundary
            raise StoreError(f"{what}: {type(exc).__name__}: {exc}") from exc

    def _key(self, kind: str, conversation_id: str) -> str:
        return f"{self.prefix}{kind}:{conversation_id}"

    # The operations, described once; _run and _arun perform them.

    def _get_op(self, conversation_id: str) -> StoreOp[ConversationState | None]:
        key = self._key("state", storable_id(conversation_id))
        return _op("get", (key,), (), _optional_state)

    def _count_op(self) -> StoreOp[int]:
        return _op("scard", (self._ids,), (), int)

    def _conversations_op(self) -> StoreOp[list[str]]:
        return _op("smembers", (self._ids,), (), lambda ids: sorted(i.decode() for i in ids))

    def _cas_op(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
        lease: Lease | None,
        release: bool,
    ) -> StoreOp[bool]:
        cid = storable_id(conversation_id)
        keys = (self._key("state", cid), self._ids, self._key("lease", cid))
        args = (
            "" if expected is None else encode_state(expected),
            encode_state(new),
            cid,
            "" if lease is None else _lease_value(lease),
            "1" if release else "0",
        )
        return _op("cas", keys, args, lambda reply: reply == 1)

    def _clear_op(self, conversation_id: str) -> StoreOp[ConversationState]:
        cid = storable_id(conversation_id)
        keys = (self._key("state", cid), self._ids, self._key("lease", cid))
        return _op("clear", keys, (_TOMB_HEAD, _TOMB_TAIL, cid), decode_state)

    def _delete_op(self, conversation_id: str) -> StoreOp[None]:
        cid = storable_id(conversation_id)
        keys = (self._key("state", cid), self._ids, self._key("lease", cid))
        return _op("delete", keys, (cid,), lambda reply: None)

    def _acquire_op(self, conversation_id: str, holder: str, ttl: float) -> StoreOp[Lease | None]:
        cid = storable_id(conversation_id)
        keys = (self._key("lease", cid), self._key("state", cid), self._fence)

        def finish(reply: Any) -> Lease | None:
            if reply is None:
                return None
            token, raw = reply
            return Lease(cid, holder, int(token), _optional_state(raw))

        return _op("acquire", keys, (holder, _ms(ttl)), finish)

    def _renew_op(self, lease: Lease, ttl: float) -> StoreOp[bool]:
        key = self._key("lease", storable_id(lease.conversation_id))
        return _op("renew", (key,), (_lease_value(lease), _ms(ttl)), lambda r: r == 1)

    def _release_op(self, lease: Lease) -> StoreOp[None]:
        key = self._key("lease", storable_id(lease.conversation_id))
        return _op("release", (key,), (_lease_value(lease),), lambda reply: None)

    def _release_holder_op(self, conversation_id: str, holder: str) -> StoreOp[None]:
        key = self._key("lease", storable_id(conversation_id))
        return _op("release_holder", (key,), (check_holder(holder),), lambda reply: None)

    def release_holder(self, conversation_id: str, holder: str) -> None:
        """Give back the conversation's lease if ``holder`` holds it, whatever its token.

        For a grant whose reply was lost (the connection dropped after the server took
        the lease): the engine knows only the holder name it asked with.
        """
        self._run(self._release_holder_op(conversation_id, holder))

    async def arelease_holder(self, conversation_id: str, holder: str) -> None:
        """Async :meth:`release_holder`."""
        await self._arun(self._release_holder_op(conversation_id, holder))

    def _writable(self, name: str) -> None:
        if self.read_only and name not in _READS:
            raise StoreError(f"redis state store {self.prefix!r} was opened read-only")

    def _run(self, op: StoreOp[T]) -> T:
        name, keys, args = op.request
        self._writable(name)
        with self._translated():
            script = self._scripts.get(name)
            if script is not None:
                reply = script(keys=list(keys), args=list(args))
            else:
                reply = getattr(self._redis, name)(*keys, *args)
        return op.finish(reply)

    async def _arun(self, op: StoreOp[T]) -> T:
        if self._async is None:
            assert self._worker is not None
            return await self._worker.run(self._run, op)
        name, keys, args = op.request
        self._writable(name)
        with self._translated():
            client, scripts = await self._async.get()
            script = scripts.get(name)
            if script is not None:
                reply = await script(keys=list(keys), args=list(args))
            else:
                reply = await getattr(client, name)(*keys, *args)
        return op.finish(reply)

    def close(self) -> None:
        """Close the clients this store made (idempotent); async ones on their loops."""
        if self._worker is not None:
            self._worker.close()
        if self._async is not None:
            self._async.close_all()
        if self._owns_client:
            self._redis.close()

    async def aclose(self) -> None:
        """Close this loop's async client, then everything :meth:`close` closes."""
        if self._async is not None:
            await self._async.close_current()
        self.close()
