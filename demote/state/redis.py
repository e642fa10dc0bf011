"""A state store in Redis, for several workers or hosts (extra ``demote[redis]``).

Each conversation's state is one JSON string under ``{prefix}state:{conversation_id}``;
the set ``{prefix}ids`` counts conversations. Compare-and-set and leases are single Lua
scripts, so they are atomic on the server. A lease (``SET NX PX``) makes one worker at a
time deliver a conversation's demotions across the fleet; the engine takes it after its
in-process gate.
"""

from __future__ import annotations

from typing import Any

from demote.errors import MissingExtraError, StoreError
from demote.records import ConversationState
from demote.state._codec import decode_state, encode_state

__all__ = ["RedisStateStore"]

_CAS = """
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if current then return 0 end
elseif current ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[3])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStateStore:
    """Conversation states in Redis.

    Args:
        url: A redis URL (``redis://host:port/db``), used when ``client`` is not given.
        client: An existing ``redis.Redis`` client (``decode_responses`` must be off).
        prefix: Prefix of every key this store writes.
    """

    def __init__(
        self, url: str | None = None, *, client: Any = None, prefix: str = "demote:"
    ) -> None:
        if client is None:
            try:
                import redis
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise MissingExtraError("redis", "redis") from exc
            client = redis.Redis.from_url(url or "redis://127.0.0.1:6379/0")
        self._redis = client
        self.prefix = prefix
        self._ids = f"{prefix}ids"
        try:
            self._cas = client.register_script(_CAS)
            self._release = client.register_script(_RELEASE)
            client.ping()
        except Exception as exc:
            raise StoreError(f"cannot reach redis: {exc}") from exc

    def _key(self, conversation_id: str) -> str:
        return f"{self.prefix}state:{conversation_id}"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # redis errors become ours at this boundary
            raise StoreError(f"redis: {exc}") from exc

    def get(self, conversation_id: str) -> ConversationState | None:
        """The stored state, or ``None``."""
        raw = self._call(self._redis.get, self._key(conversation_id))
        return None if raw is None else decode_state(raw)

    def compare_and_set(
        self,
        conversation_id: str,
        expected: ConversationState | None,
        new: ConversationState,
    ) -> bool:
        """Store ``new`` if the current state equals ``expected`` (one Lua script)."""
        args = ["" if expected is None else encode_state(expected), encode_state(new)]
        keys = [self._key(conversation_id), self._ids]
        return bool(self._call(self._cas, keys=keys, args=[*args, conversation_id]))

    def delete(self, conversation_id: str) -> None:
        """Forget the conversation's state."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(self._key(conversation_id))
        pipe.srem(self._ids, conversation_id)
        self._call(pipe.execute)

    def count(self) -> int:
        """How many conversations have state."""
        return int(self._call(self._redis.scard, self._ids))

    def acquire_lease(self, conversation_id: str, holder: str, ttl: float) -> bool:
        """Take the conversation's delivery lease for ``ttl`` seconds if it is free."""
        key = f"{self.prefix}lease:{conversation_id}"
        return bool(self._call(self._redis.set, key, holder, nx=True, px=max(1, int(ttl * 1000))))

    def release_lease(self, conversation_id: str, holder: str) -> None:
        """Give the lease back, only if ``holder`` still has it."""
        self._call(self._release, keys=[f"{self.prefix}lease:{conversation_id}"], args=[holder])

    def close(self) -> None:
        """Close the client's connections (idempotent)."""
        self._redis.close()
