"""``demote demo`` in-process: what it checks before creating anything, and how it resumes
or restarts a folder whose last run stopped half-way."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")

import llamaindex_demote.demo as llamaindex_half
from demote import ConfigError, ConversationState, SQLiteStateStore
from demote.cli.demo import run_demo
from demote.cli.demo_parts import DemoOptions

TURNS = 24


def demo(folder: Path, **options: object) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    settings: dict[str, object] = {"directory": folder, "turns": TURNS, "progress": False}
    run_demo(DemoOptions(**{**settings, **options}), out, err)  # type: ignore[arg-type]
    return out.getvalue(), err.getvalue()


def history_lines(folder: Path) -> int:
    return len((folder / "langchain-history.jsonl").read_text().splitlines())


def crashed_run(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped in the LlamaIndex half, as if the user pressed Ctrl-C half-way."""

    def play(*args: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(llamaindex_half, "play", play)
        with pytest.raises(KeyboardInterrupt):
            demo(folder)


def test_a_bad_model_leaves_nothing_behind(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    with pytest.raises(ConfigError, match="--model 'nope:nothing'"):
        demo(folder, model="nope:nothing")
    assert not folder.exists()


def test_a_bad_policy_or_turns_leaves_nothing_behind(tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    with pytest.raises(ConfigError):
        demo(folder, policy='{"unit": "tokens"}')
    with pytest.raises(ConfigError, match="--turns"):
        demo(folder, turns=0)
    with pytest.raises(ConfigError, match="snap-research/locomo"):
        demo(folder, locomo=tmp_path / "conv-26.json")  # says where to get the file
    assert not folder.exists()


def test_an_unfinished_run_is_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "demo"
    crashed_run(folder, monkeypatch)
    progress = json.loads((folder / "progress.json").read_text())
    assert progress == {"source": progress["source"], "runs": 0, "next_turn": 0, "unfinished": True}
    assert history_lines(folder) == 2 * (TURNS + 1)  # the LangChain half had finished

    out, err = demo(folder)
    assert "resuming run 1" in err and "stopped before it finished" in err
    assert "run 1:" in out and "re-delivered: 0" in out
    assert out.count("[answer found: yes]") == 2, out
    # The LangChain half played its turns again on top of the kept history.
    assert history_lines(folder) == 4 * (TURNS + 1)
    assert "unfinished" not in json.loads((folder / "progress.json").read_text())

    out, err = demo(folder)
    assert err == "" and "run 2:" in out and "re-delivered: 0" in out


def test_restart_starts_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "demo"
    crashed_run(folder, monkeypatch)
    out, err = demo(folder, restart=True)
    assert "starting over" in err
    assert "run 1:" in out and "re-delivered: 0" in out
    assert history_lines(folder) == 2 * (TURNS + 1)  # only this run's turns


def test_stores_without_progress_are_adopted(tmp_path: Path) -> None:
    # What an older version left after failing on a missing extra: stores, no progress.json.
    folder = tmp_path / "demo"
    demo(folder)
    (folder / "progress.json").unlink()
    out, err = demo(folder)
    assert "resuming the unfinished demo" in err
    assert "run 1:" in out and "re-delivered: 0" in out


def test_someone_elses_stores_are_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    with SQLiteStateStore(folder / "state.db") as store:
        assert store.compare_and_set("user-42", None, ConversationState(2, 2))
    before = (folder / "state.db").read_bytes()
    for restart in (False, True):
        with pytest.raises(ConfigError, match="not a demo's"):
            demo(folder, restart=restart)
    assert (folder / "state.db").read_bytes() == before
