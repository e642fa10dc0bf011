"""The shared conformance suite, run against ``DemotingMemory`` (sync, async)."""

from __future__ import annotations

import pytest

from tests.conformance.contract import DemotingMemoryContract
from tests.conformance.driver import MakeDriver
from tests.llamaindex_demote.support import make_llamaindex_driver


class TestDemotingMemory(DemotingMemoryContract):
    @pytest.fixture
    def make_driver(self) -> MakeDriver:
        return make_llamaindex_driver
