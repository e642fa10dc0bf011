"""Token counters and the per-fingerprint cache."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demote import ConfigError, SlidingWindow
from demote.records import fingerprint
from demote.window import tokens as tokens_mod
from demote.window.tokens import (
    MESSAGE_OVERHEAD,
    TokenCache,
    approximate_tokens,
    counter_name,
    register_counter,
    resolve_counter,
)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=0, max_size=2000))
def test_approx_matches_langchain_on_plain_human_messages(text: str) -> None:
    messages = pytest.importorskip(
        "langchain_core.messages", reason="langchain-core not installed (demote[langchain])"
    )
    utils = pytest.importorskip("langchain_core.messages.utils")
    theirs = utils.count_tokens_approximately([messages.HumanMessage(text)])
    ours = TokenCache("approx").count(fingerprint("user", text), text)
    # langchain-core also counts the role name ("user", one token's worth of characters).
    assert abs(theirs - ours) <= 2


def test_approx_is_characters_over_four_rounded_up() -> None:
    assert [approximate_tokens("x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def _tiktoken_cached() -> bool:
    """cl100k_base is usable offline only if tiktoken's cache already holds it."""
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    cache = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    cache = cache or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.path.exists(os.path.join(cache, hashlib.sha1(url.encode()).hexdigest()))


def test_tiktoken_counter_when_installed() -> None:
    pytest.importorskip("tiktoken", reason="tiktoken not installed (demote[tiktoken])")
    if not _tiktoken_cached():
        pytest.skip("tiktoken's cl100k_base encoding is not cached and the network is off")
    count = resolve_counter("tiktoken")
    assert count("hello world") == 2
    assert TokenCache("tiktoken").count("fp", "hello world") == 2 + MESSAGE_OVERHEAD


def test_tiktoken_counter_wiring(monkeypatch: pytest.MonkeyPatch) -> None:
    """The "tiktoken" name resolves lazily through tiktoken.get_encoding (faked: offline)."""
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken not installed")

    class FakeEncoding:
        def encode(self, text: str, disallowed_special: tuple[()] = ()) -> list[int]:
            return list(range(len(text.split())))

    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: FakeEncoding())
    monkeypatch.setattr(tokens_mod, "_REGISTRY", dict(tokens_mod._REGISTRY))
    tokens_mod._REGISTRY.pop("tiktoken", None)
    assert resolve_counter("tiktoken")("one two three") == 3
    assert counter_name(resolve_counter("tiktoken")) == "tiktoken"


def test_tiktoken_encoding_that_cannot_load_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tiktoken = pytest.importorskip("tiktoken", reason="tiktoken not installed")

    def offline(name: str) -> None:
        raise OSError("network is unreachable")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    monkeypatch.setattr(tokens_mod, "_REGISTRY", dict(tokens_mod._REGISTRY))
    tokens_mod._REGISTRY.pop("tiktoken", None)
    with pytest.raises(ConfigError, match=r"counter.*unreachable"):
        SlidingWindow.last_tokens(100, counter="tiktoken")
    assert "tiktoken" not in tokens_mod._REGISTRY, "retried on the next use"


def test_counts_are_cached_per_fingerprint() -> None:
    calls: list[str] = []
    lock = threading.Lock()

    def counter(text: str) -> int:
        with lock:
            calls.append(text)
        return len(text)

    cache = TokenCache(counter)
    texts = [f"message {i}" for i in range(20)]
    for _ in range(3):
        for t in texts:
            assert cache.count(fingerprint("user", t), t) == len(t) + MESSAGE_OVERHEAD
    assert sorted(calls) == sorted(texts), "called once per distinct message"
    assert len(cache) == 20
    # From many threads at once, still bounded by the distinct messages.
    threads = [
        threading.Thread(target=lambda: [cache.count(fingerprint("user", t), t) for t in texts])
        for _ in range(8)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join(10)
    assert len(calls) == 20


def test_cache_is_bounded() -> None:
    cache = TokenCache("approx", max_entries=10)
    for i in range(50):
        cache.count(str(i), "x" * i)
    assert len(cache) == 10


@pytest.mark.parametrize("bad", [-1, 2.0, "3", None, True])
def test_counter_returning_bad_values_is_a_config_error(bad: object) -> None:
    cache = TokenCache(lambda text: bad)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigError, match="counter"):
        cache.count("fp", "text")
    assert len(cache) == 0


def test_registry() -> None:
    def words(text: str) -> int:
        return len(text.split())

    register_counter("test-tokens-words", words)
    assert resolve_counter("test-tokens-words") is words
    assert counter_name(words) == "test-tokens-words"
    assert counter_name(lambda t: 0) is None
    assert counter_name("approx") == "approx"
    with pytest.raises(ConfigError, match="unknown counter"):
        resolve_counter("nope")
    with pytest.raises(ConfigError):
        register_counter("", words)
    with pytest.raises(ConfigError):
        register_counter("x", "not callable")  # type: ignore[arg-type]
