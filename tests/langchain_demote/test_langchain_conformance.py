"""The shared conformance suite, run against ``DemotingChatMessageHistory`` (sync, async)."""

from __future__ import annotations

import pytest

from tests.conformance.contract import DemotingMemoryContract
from tests.conformance.driver import MakeDriver
from tests.langchain_demote.support import make_langchain_driver


class TestDemotingChatMessageHistory(DemotingMemoryContract):
    @pytest.fixture
    def make_driver(self) -> MakeDriver:
        return make_langchain_driver
