"""Test-wide settings: nothing reaches the network, no telemetry, no tracing."""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator

import pytest

from tests.support.network import guarded_connect

# Set before any test module imports mem0 or langchain (they read these at import time).
os.environ["MEM0_TELEMETRY"] = "False"
if "MEM0_DIR" not in os.environ:  # mem0's home for this run, removed when it ends
    os.environ["MEM0_DIR"] = tempfile.mkdtemp(prefix="demote-mem0-")
    atexit.register(shutil.rmtree, os.environ["MEM0_DIR"], ignore_errors=True)
os.environ["LANGSMITH_TRACING"] = "false"
os.environ["LANGCHAIN_TRACING_V2"] = "false"
os.environ["ANONYMIZED_TELEMETRY"] = "False"
os.environ["HF_HUB_OFFLINE"] = "1"
for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MEM0_API_KEY", "LANGSMITH_API_KEY"):
    os.environ.pop(key, None)

# CI must be reproducible: there Hypothesis draws the same examples every run (locally
# they stay random, so new counterexamples keep turning up where someone can look at them).
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
    # `make fuzz`: random draws whatever CI says, and the property tests that take their
    # budget from tests.strategies.examples run DEMOTE_FUZZ_EXAMPLES examples each.
    _hypothesis_settings.register_profile(
        "fuzz",
        derandomize=False,
        deadline=None,
        print_blob=True,
        max_examples=int(os.environ.get("DEMOTE_FUZZ_EXAMPLES", "2000")),
    )
    _profile = os.environ.get("DEMOTE_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "")
    if _profile:
        _hypothesis_settings.load_profile(_profile)
except ImportError:  # pragma: no cover - hypothesis is a dev dependency
    pass


@pytest.fixture(autouse=True)
def _no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Any connection to a non-loopback address fails the calling code at once."""
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    yield


def _service_url(name: str) -> str:
    """The URL of a test service, or skip (fail under CI, where services are required)."""
    var = f"DEMOTE_TEST_{name.upper()}_URL"
    url = os.environ.get(var)
    required = os.environ.get("DEMOTE_TEST_REQUIRE_SERVICES") == "1"
    if not url:
        if required:
            pytest.fail(f"{var} is not set but DEMOTE_TEST_REQUIRE_SERVICES=1")
        pytest.skip(f"{var} not set: {name} tests need a running {name} (.ci/run sets it)")
    return url


@pytest.fixture
def redis_url() -> str:
    """``DEMOTE_TEST_REDIS_URL``; a flushed database for the test."""
    url = _service_url("redis")
    try:
        import redis

        client = redis.Redis.from_url(url)
        client.ping()
        client.flushdb()
        client.close()
    except Exception as exc:
        pytest.fail(f"redis at {url} is unreachable: {exc}")
    return url


@pytest.fixture
def postgres_url() -> str:
    """``DEMOTE_TEST_POSTGRES_URL``, checked reachable."""
    url = _service_url("postgres")
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=5).close()
    except Exception as exc:
        pytest.fail(f"postgres at {url} is unreachable: {exc}")
    return url


@pytest.fixture(autouse=True)
def _restart_warning_not_given_yet() -> None:
    """Each test is a fresh process for ``demote.restarts``' once-per-process warning.

    Else whichever test first paired a durable inner store with an in-memory state would
    get it (an error, as every warning here), and the others not, by test order.
    """
    import demote.restarts

    demote.restarts._warned = False


@pytest.fixture(autouse=True)
def _close_leftover_event_loop() -> Iterator[None]:
    """Close an event loop a test left set on the main thread.

    LlamaIndex's sync APIs (``asyncio_run``) create a loop with ``get_event_loop`` and
    never close it; left alone it is garbage-collected during a later test, whose strict
    warnings then fail on the ResourceWarning.
    """
    yield
    import asyncio
    import warnings

    policy = asyncio.get_event_loop_policy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            loop = policy.get_event_loop()
        except RuntimeError:
            return
    if not loop.is_running() and not loop.is_closed():
        loop.close()
    policy.set_event_loop(None)
