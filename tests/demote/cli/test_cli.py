"""The ``demote`` command line, run through its installed entry point in a subprocess.

Covers ``demo`` (twice in one folder: the second run continues and re-delivers nothing;
its checks before anything is created; resuming or restarting an unfinished folder),
``replay`` on each transcript format, ``inspect`` and ``search`` on the demo's stores, the
one-line errors (exit code 2, never a traceback) and the layout of the tables.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
LOCOMO = Path(os.environ.get("DEMOTE_LOCOMO") or REPO.parent / "shared" / "data" / "locomo")
LOCOMO_FILE = LOCOMO / "conv-26.json"
needs_locomo = pytest.mark.skipif(
    not LOCOMO_FILE.is_file(), reason=f"LoCoMo data not found at {LOCOMO} (../shared/data/locomo)"
)
# The LoCoMo files are not part of the package: tests read them from ../shared, never copy.


def _command() -> list[str]:
    """The installed ``demote`` script next to this interpreter, else ``python -m``."""
    script = shutil.which("demote", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "demote.cli"]


def run(
    *args: str, cwd: Path, timeout: float = 120, pythonpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MEM0_TELEMETRY": "False",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "ANONYMIZED_TELEMETRY": "False",
        "HF_HUB_OFFLINE": "1",
    }
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        env.pop(key, None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [*_command(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("demote: error: ")
    return lines[0]


# --------------------------------------------------------------------------- demo


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two demo runs in one folder (120 turns each, to keep the module fast)."""
    cwd = tmp_path_factory.mktemp("demo")
    outputs = []
    for _ in range(2):
        proc = run("demo", "--turns", "120", "--no-progress", cwd=cwd)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
        outputs.append(proc.stdout)
    return cwd / "demote-demo", outputs


def test_demo_first_run_demotes_and_recalls_the_early_fact(
    demo_runs: tuple[Path, list[str]],
) -> None:
    folder, (first, _) = demo_runs
    assert "run 1:" in first
    assert "LangChain" in first and "LlamaIndex" in first
    assert "re-delivered: 0" in first
    assert first.count("[answer found: yes]") == 2, first
    assert "4512" in first
    for name in ("state.db", "archive.db", "langchain-history.jsonl", "llamaindex-chats.jsonl"):
        assert (folder / name).is_file(), name


def test_demo_second_run_continues_and_redelivers_nothing(
    demo_runs: tuple[Path, list[str]],
) -> None:
    folder, (_, second) = demo_runs
    assert "run 2:" in second
    assert "re-delivered: 0" in second
    histories = [line for line in second.splitlines() if line.startswith("messages in history")]
    assert histories and "484" in histories[0], second  # 2 x (120 turns + 1 question) x 2
    lines = (folder / "langchain-history.jsonl").read_text().splitlines()
    assert len(lines) == 484


def test_demo_policy_json_and_compact(tmp_path: Path) -> None:
    policy = (
        '{"unit": "messages", "limit": 20, "eviction": {"kind": "compact", "compact_count": 10}}'
    )
    proc = run("demo", "--dir", "d", "--turns", "40", "--policy", policy, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "messages<=20, compact(10)" in proc.stdout


@needs_locomo
def test_demo_plays_a_locomo_file(tmp_path: Path) -> None:
    proc = run("demo", "--locomo", str(LOCOMO_FILE), "--turns", "40", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "LoCoMo conv-26" in proc.stdout
    assert "re-delivered: 0" in proc.stdout


def test_demo_checks_the_extras_before_creating_anything(tmp_path: Path) -> None:
    # A LlamaIndex that cannot be imported, as in a `demote[langchain]`-only environment.
    blocker = tmp_path / "blocker" / "llama_index"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('not installed here')\n")
    proc = run("demo", "--turns", "5", cwd=tmp_path, pythonpath=str(blocker.parent))
    assert "pip install 'demote[llamaindex]'" in one_line_error(proc)
    assert not (tmp_path / "demote-demo").exists()
    # Once the extra is there, the same command just works.
    proc = run("demo", "--turns", "5", "--no-progress", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "run 1:" in proc.stdout


def test_demo_refuses_another_conversation_in_the_same_folder(
    demo_runs: tuple[Path, list[str]], tmp_path: Path
) -> None:
    if not LOCOMO_FILE.is_file():
        pytest.skip(f"LoCoMo data not found at {LOCOMO}")
    folder, _ = demo_runs
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    proc = run("demo", "--dir", str(copy), "--locomo", str(LOCOMO_FILE), cwd=tmp_path)
    line = one_line_error(proc)
    assert "use another --dir" in line and "--restart" in line


# --------------------------------------------------------------------------- inspect, search


def test_inspect_shows_both_conversations(demo_runs: tuple[Path, list[str]]) -> None:
    folder, _ = demo_runs
    proc = run("inspect", "--state", "state.db", "--archive", "archive.db", cwd=folder, timeout=30)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines() if line}
    assert {"demo-langchain", "demo-llamaindex"} <= set(rows)
    start, watermark, pending, _, archived = rows["demo-langchain"][1:6]
    assert int(start) == int(watermark) == int(archived) > 0
    assert pending == "0"
    assert "pending in" not in proc.stdout  # nothing pending: no note


def test_inspect_one_conversation_with_an_outbox(demo_runs: tuple[Path, list[str]]) -> None:
    from demote.capture.outbox import SQLiteOutbox

    folder, _ = demo_runs
    SQLiteOutbox(folder / "outbox.db").close()
    proc = run("inspect", "--state", "state.db", "--outbox", "outbox.db", "demo-llamaindex",
               cwd=folder, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "demo-llamaindex" in proc.stdout and "demo-langchain" not in proc.stdout
    assert "0 dead letters" in proc.stdout


def test_search_finds_the_early_fact(demo_runs: tuple[Path, list[str]]) -> None:
    folder, _ = demo_runs
    proc = run("search", "--archive", "archive.db", "demo-langchain", "locker code", "-k", "3",
               cwd=folder, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("1. ") and "4512" in first


def test_inspect_an_unknown_conversation_fails(demo_runs: tuple[Path, list[str]]) -> None:
    folder, _ = demo_runs
    proc = run("inspect", "--state", "state.db", "--archive", "archive.db", "nope",
               cwd=folder, timeout=30)  # fmt: skip
    line = one_line_error(proc)
    assert "unknown conversation 'nope'" in line and "demo-langchain" in line
    assert proc.stdout == ""


def test_inspect_right_aligns_numbers(demo_runs: tuple[Path, list[str]]) -> None:
    folder, _ = demo_runs
    proc = run("inspect", "--state", "state.db", "--archive", "archive.db", cwd=folder,
               timeout=30)  # fmt: skip
    header, *rows = proc.stdout.split("\n\n")[1].splitlines()  # after what each store reads
    # Every column after the first (the conversation id) ends where its header ends.
    ends = [m.end() for m in re.finditer(r"\S+(?: \S+)*", header)][1:]
    assert len(ends) == 6
    for row in rows:
        assert [m.end() for m in re.finditer(r"\S+", row)][1:] == ends, (header, row)


@pytest.mark.parametrize(
    ("name", "described"),
    [
        ("llamaindex-chats.jsonl", "demo-llamaindex (llamaindex, "),
        ("langchain-history.jsonl", "langchain-history (langchain, "),
    ],
)
def test_replay_reads_what_the_demo_writes(
    demo_runs: tuple[Path, list[str]], name: str, described: str
) -> None:
    # The failure: "llamaindex-chats.jsonl: line 1: missing 'role'".
    folder, _ = demo_runs
    messages = len((folder / name).read_text().splitlines())
    proc = run("replay", name, "--no-progress", cwd=folder, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"transcript: {described}{messages} messages)")
    table = proc.stdout.split("\n\n")[1].splitlines()
    assert len(table) == 5  # a header and the four default policies


def test_missing_store_is_a_one_line_error(tmp_path: Path) -> None:
    proc = run("inspect", "--state", "nope.db", cwd=tmp_path, timeout=30)
    assert "nope.db: no such file" in one_line_error(proc)
    assert not (tmp_path / "nope.db").exists()


# --------------------------------------------------------------------------- replay


def _chat(n: int) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        out.append(("user", f"Turn {i}: tell me something about topic number {i} please."))
        out.append(("assistant", f"Here is a fairly long answer about topic {i}. " * 4))
    return out


SMALL = '{"unit": "tokens", "limit": 400, "eviction": {"kind": "bulk", "overflow": 200}}'


def chat_file(folder: Path, turns: int) -> Path:
    path = folder / "chat.jsonl"
    lines = [json.dumps({"role": r, "content": t}) + "\n" for r, t in _chat(turns)]
    path.write_text("".join(lines))
    return path


def test_replay_jsonl(tmp_path: Path) -> None:
    path = chat_file(tmp_path, 60)
    proc = run("replay", str(path), "--policy", SMALL, "--policy",
               '{"unit": "turns", "limit": 5}', cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "jsonl, 120 messages" in proc.stdout
    assert "tokens<=400, bulk(+200)" in proc.stdout and "turns<=5, per_item" in proc.stdout
    assert "recall@" not in proc.stdout  # no questions in a plain chat
    table = proc.stdout.split("\n\n")[1].splitlines()
    assert len(table) == 3
    # Right-aligned columns: every line of the table ends at the same place.
    assert len({len(line) for line in table}) == 1, table
    assert proc.stderr.splitlines() == [
        "demote replay: [1/2] tokens<=400, bulk(+200)",
        "demote replay: [2/2] turns<=5, per_item",
    ]
    quiet = run("replay", str(path), "--no-progress", cwd=tmp_path, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_replay_langchain_dicts_with_default_policies(tmp_path: Path) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, messages_to_dict

    messages = [HumanMessage(t) if r == "user" else AIMessage(t) for r, t in _chat(150)]
    path = tmp_path / "history.json"
    path.write_text(json.dumps(messages_to_dict(messages)))
    proc = run("replay", str(path), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "langchain, 300 messages" in proc.stdout
    assert "tokens<=2000, compact(1000), no summarizer" in proc.stdout
    assert "compact, no summarizer: nothing is summarized" in proc.stdout


@needs_locomo
def test_replay_locomo_reports_recall_and_plots(tmp_path: Path) -> None:
    plot = tmp_path / "windows.png"
    proc = run("replay", str(LOCOMO_FILE), "--policy", SMALL, "--plot", str(plot),
               cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "locomo" in proc.stdout and "recall@5" in proc.stdout
    assert plot.is_file() and plot.stat().st_size > 1000


def test_replay_compact_with_the_template_summarizer(tmp_path: Path) -> None:
    path = chat_file(tmp_path, 60)
    compact = (
        '{"unit": "tokens", "limit": 400, "eviction": {"kind": "compact", "compact_count": 200}}'
    )
    proc = run("replay", str(path), "--policy", compact, "--summarizer", "template",
               cwd=tmp_path, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "tokens<=400, compact(200), template summary" in proc.stdout
    assert "no summarizer" not in proc.stdout


@pytest.mark.parametrize("name", ["out.txt", "out", "missing/out.png"])
def test_a_plot_that_cannot_be_written_fails_before_the_replay(tmp_path: Path, name: str) -> None:
    path = chat_file(tmp_path, 5)
    proc = run("replay", str(path), "--plot", name, cwd=tmp_path, timeout=30)
    assert "--plot" in one_line_error(proc)
    assert proc.stdout == ""  # nothing was replayed


def test_malformed_transcript_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"role": "user", "content": "hi"}\n\n{"role": "user", "content": \n')
    line = one_line_error(run("replay", str(path), cwd=tmp_path, timeout=30))
    assert "line 3" in line and "bad.jsonl" in line


def test_unknown_role_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"role": "user", "content": "hi"}\n{"role": "robot", "content": "x"}\n')
    assert "line 2" in one_line_error(run("replay", str(path), cwd=tmp_path, timeout=30))


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("{not json", "not valid JSON"),
        ('{"unit": "tokens"}', "limit"),
        ('{"unit": "tokens", "limit": 10, "eviction": {"kind": "bulk"}}', "overflow"),
    ],
)
def test_bad_policy_is_a_one_line_error(tmp_path: Path, policy: str, expected: str) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text('{"role": "user", "content": "hi"}\n')
    line = one_line_error(run("replay", str(path), "--policy", policy, cwd=tmp_path, timeout=30))
    assert "--policy #1" in line and expected in line


def test_missing_transcript_and_bad_arguments(tmp_path: Path) -> None:
    assert "no such file" in one_line_error(run("replay", "nope.jsonl", cwd=tmp_path, timeout=30))
    line = one_line_error(run("demo", "--strategy", "fast", cwd=tmp_path, timeout=30))
    assert "--strategy" in line
    assert "required" in one_line_error(run(cwd=tmp_path, timeout=30))


def test_version(tmp_path: Path) -> None:
    from importlib.metadata import version

    import demote

    proc = run("--version", cwd=tmp_path, timeout=30)
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"demote {version('demote')}" == f"demote {demote.__version__}"


def test_help_lists_the_subcommands(tmp_path: Path) -> None:
    proc = run("--help", cwd=tmp_path, timeout=30)
    assert proc.returncode == 0
    for name in ("demo", "replay", "inspect", "search"):
        assert name in proc.stdout


def test_main_in_process_returns_the_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from demote.cli import main

    assert main(["search", "--archive", str(tmp_path / "none.db"), "c", "q"]) == 2
    assert capsys.readouterr().err.startswith("demote: error: --archive ")
