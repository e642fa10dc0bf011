"""The archive contract (archive_contract.py) on SQLiteArchive and PostgresArchive."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demote.archive.postgres import PostgresArchive
from demote.archive.sqlite import SQLiteArchive
from tests.demote.archive.archive_contract import ArchiveContract
from tests.demote.archive.pg import drop_archive
from tests.demote.state.conftest import mode  # noqa: F401  (the contract's fixture)


class TestSQLiteArchive(ArchiveContract):
    @pytest.fixture
    def raw_opener(self, tmp_path: Path) -> Callable[..., Any]:
        return lambda **options: SQLiteArchive(tmp_path / "archive.db", **options)


class TestPostgresArchive(ArchiveContract):
    @pytest.fixture
    def raw_opener(self, postgres_url: str, request: pytest.FixtureRequest) -> Callable[..., Any]:
        table = f"t_{uuid.uuid4().hex[:12]}"
        request.addfinalizer(lambda: drop_archive(postgres_url, table))
        return lambda **options: PostgresArchive(postgres_url, table=table, **options)
