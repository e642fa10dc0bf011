"""The PostgreSQL archive's statements, written once for its sync and async drivers.

Every conversation id is a bound parameter (``%(cid)s``) and so is its scope digest; the
only names interpolated are the archive's checked table name and the pgvector schema read
from the catalog. Each statement that reads or writes messages compares both ``scope``
and ``conversation_id``.

Ranking (:attr:`Statements.candidates`). FTS5's BM25, which the SQLite archive uses, is

    score = sum over query terms of  idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

with ``k1 = 1.2``, ``b = 0.75``, ``tf`` the term's occurrences weighted by column, ``dl``
the row's tokens and ``idf = ln((N - n + 0.5) / (n + 0.5))`` (at least 1e-6). Here ``tf``
is ``ts_rank_cd`` of the one term with the column weights (for one lexeme it sums the
weights of its positions, which is FTS5's weighted frequency), ``dl`` is the row's stored
token count and ``N``, ``n`` and ``avgdl`` come from the per-conversation statistics. The
difference from FTS5: FTS5 takes ``N``, ``n`` and ``avgdl`` over the whole table (every
conversation in the file), this archive over the conversation searched, so with one
conversation in each the scores are the same, and with many a conversation's ranking here
does not depend on the others.
"""

from __future__ import annotations

from functools import cache

from demote.archive.postgres._schema import Layout

__all__ = ["Statements"]

_COLUMNS = "m.id, m.idx, m.role, m.text, m.key, m.context, m.speaker"
_MINE = "m.scope = %(scope)s AND m.conversation_id = %(cid)s"


def _neighbour(t: str, step: str) -> str:
    # The newest message at idx - 1 (or + 1): a rewrite may leave two at one index.
    return (
        f"LEFT JOIN LATERAL (SELECT x.tsv FROM {t} x WHERE x.scope = m.scope "
        f"AND x.conversation_id = m.conversation_id AND x.idx = m.idx {step} 1 "
        f"ORDER BY x.id DESC LIMIT 1) AS {'p' if step == '-' else 'n'} ON true"
    )


class Statements:
    """The statements of one archive table."""

    def __init__(self, layout: Layout) -> None:
        t, cfg = layout.table, layout.config
        self.layout = layout
        self._t = t
        self.lock = "SELECT pg_advisory_xact_lock(%(lock)s)"
        # The fence is read after the lock (a statement of its own, so a fresh snapshot):
        # an erase that committed while this delivery waited is seen.
        self.open_conversation = (
            f"WITH f AS (SELECT fence FROM {t}_erased WHERE scope = %(scope)s "
            "AND conversation_id = %(cid)s), "
            f"ins AS (INSERT INTO {t}_conversations (scope, conversation_id) "
            "SELECT %(scope)s, %(cid)s WHERE NOT EXISTS "
            "(SELECT 1 FROM f WHERE f.fence > %(fence)s::bigint) "
            "ON CONFLICT (scope) DO NOTHING RETURNING id) "
            "SELECT (SELECT fence FROM f), coalesce((SELECT id FROM ins), "
            f"(SELECT id FROM {t}_conversations WHERE scope = %(scope)s "
            "AND conversation_id = %(cid)s))"
        )
        self.insert = (
            f"INSERT INTO {t} (scope, conversation_id, idx, role, text, context, speaker, "
            "key, tsv, data, archived_at) SELECT %(scope)s, %(cid)s, r.idx, r.role, r.text, "
            f"r.context, r.speaker, r.key, setweight(to_tsvector({cfg}, r.words), 'A') || "
            f"setweight(to_tsvector({cfg}, r.cwords), 'B') || %(mark)s::tsvector, r.data, "
            "%(at)s::float8 FROM unnest(%(idx)s::bigint[], %(role)s::text[], %(text)s::text[], "
            "%(context)s::text[], %(speaker)s::text[], %(key)s::text[], %(words)s::text[], "
            "%(cwords)s::text[], %(data)s::text[]) WITH ORDINALITY AS "
            "r(idx, role, text, context, speaker, key, words, cwords, data, n) "
            "ORDER BY r.n ON CONFLICT (scope, key) DO NOTHING RETURNING id, key, idx"
        )
        counters = ", ".join(f"{c} = s.{c} + excluded.{c}" for c in _COUNTERS)
        self.refresh = (
            "WITH want AS (SELECT DISTINCT unnest(%(near)s::bigint[]) AS idx), "
            "cur AS (SELECT m.id, m.id = ANY(%(fresh)s::bigint[]) AS fresh, m.tsv AS old, "
            "m.tokens AS old_tokens, ts_filter(m.tsv, '{a,b,d}') || setweight("
            "ts_filter(coalesce(p.tsv, ''), '{a}') || ts_filter(coalesce(n.tsv, ''), '{a}'), "
            f"'C') AS tsv FROM {t} m JOIN want ON want.idx = m.idx "
            f"{_neighbour(t, '-')} {_neighbour(t, '+')} WHERE {_MINE}), "
            f"upd AS (UPDATE {t} m SET tsv = cur.tsv, tokens = "
            "(SELECT count(*) FROM unnest(cur.tsv) AS u, unnest(u.positions)) "
            "FROM cur WHERE m.id = cur.id AND (cur.fresh OR m.tsv <> cur.tsv) "
            "RETURNING cur.fresh, cur.old, m.tsv AS new, "
            "m.tokens - CASE WHEN cur.fresh THEN 0 ELSE cur.old_tokens END AS delta), "
            "lex AS (SELECT u.lexeme, u.weights, 1 AS sign FROM upd, unnest(upd.new) AS u "
            "UNION ALL SELECT u.lexeme, u.weights, -1 FROM upd, unnest(upd.old) AS u "
            "WHERE NOT upd.fresh), "
            "counted AS (SELECT lexeme, "
            "sum(sign * ('A' = ANY(weights))::int) AS in_text, "
            "sum(sign * (weights && '{A,B}')::int) AS in_any, "
            "sum(sign * (weights && '{A,C}')::int) AS in_adj, "
            "sum(sign * (weights && '{A,B,C}')::int) AS in_all FROM lex GROUP BY lexeme), "
            f"terms AS (INSERT INTO {t}_terms AS s (conversation, term, {', '.join(_COUNTERS)}) "
            f"SELECT %(conv)s, lexeme, {', '.join(_COUNTERS)} FROM counted "
            f"WHERE {' OR '.join(f'{c} <> 0' for c in _COUNTERS)} ORDER BY lexeme "
            f"ON CONFLICT (conversation, term) DO UPDATE SET {counters}), "
            f"spk AS (INSERT INTO {t}_speakers (conversation, speaker) "
            f"SELECT DISTINCT %(conv)s::bigint, speaker FROM {t} "
            "WHERE id = ANY(%(fresh)s::bigint[]) AND speaker <> '' ON CONFLICT DO NOTHING) "
            f"UPDATE {t}_conversations SET messages = messages + "
            "cardinality(%(fresh)s::bigint[]), "
            "tokens = tokens + (SELECT coalesce(sum(delta), 0) FROM upd) WHERE id = %(conv)s"
        )
        vector = "(%(flat)s::real[])[(u.n - 1) * %(dims)s + 1 : u.n * %(dims)s]"
        if layout.pgvector is not None:
            vector = f"{vector}::{layout.vector_type}"
        self.insert_vectors = (
            f"WITH v AS (INSERT INTO {t}_vectors (message, conversation, idx, embedding) "
            f"SELECT m.id, c.id, m.idx, {vector} "
            f"FROM unnest(%(ids)s::bigint[]) WITH ORDINALITY AS u(id, n) JOIN {t} m "
            f"ON m.id = u.id JOIN {t}_conversations c ON c.scope = m.scope ORDER BY u.n "
            "ON CONFLICT (message) DO NOTHING RETURNING conversation, seq) "
            f"UPDATE {t}_conversations c SET vectors = c.vectors + v.n, "
            "vector_seq = greatest(c.vector_seq, v.top) FROM (SELECT conversation, "
            "count(*) AS n, max(seq) AS top FROM v GROUP BY conversation) AS v "
            "WHERE c.id = v.conversation"
        )
        self.unembedded = (
            f"SELECT m.id, m.text, m.speaker FROM {t} m WHERE NOT EXISTS "
            f"(SELECT 1 FROM {t}_vectors v WHERE v.message = m.id) ORDER BY m.id LIMIT %(n)s"
        )
        self.settings = f"SELECT name, value FROM {t}_settings"
        # One row as JSON: the columns this version of the table has, by name (a newer
        # schema's whole-message column included), without the index's own columns.
        self.fetch = (
            f"SELECT to_jsonb(m) - 'tsv' - 'context' FROM {t} m "
            "WHERE m.scope = %(scope)s AND m.conversation_id = %(cid)s AND m.key = %(key)s "
            "ORDER BY m.id DESC LIMIT 1"
        )
        self.record_model = (
            f"INSERT INTO {t}_settings (name, value) VALUES ('embedding_model', %(name)s), "
            "('embedding_dims', %(dims)s) ON CONFLICT DO NOTHING"
        )
        self.clear_vectors = (
            f"WITH d AS (DELETE FROM {t}_vectors RETURNING 1), s AS (DELETE FROM {t}_settings "
            "WHERE name IN ('embedding_model', 'embedding_dims') RETURNING 1) "
            f"UPDATE {t}_conversations SET vectors = 0 "
            "WHERE (SELECT count(*) FROM d) + (SELECT count(*) FROM s) >= 0"
        )
        self.erase = (
            f"WITH d AS (DELETE FROM {t} m WHERE {_MINE} RETURNING 1), "
            f"c AS (DELETE FROM {t}_conversations WHERE scope = %(scope)s "
            "AND conversation_id = %(cid)s RETURNING 1), "
            f"e AS (INSERT INTO {t}_erased (scope, conversation_id, fence) "
            "SELECT %(scope)s, %(cid)s, %(fence)s::bigint WHERE %(fence)s::bigint IS NOT NULL "
            "ON CONFLICT (scope) DO UPDATE SET fence = "
            f"greatest({t}_erased.fence, excluded.fence) RETURNING 1) "
            "SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM c), (SELECT count(*) FROM e)"
        )
        # -- reading -------------------------------------------------------------------
        self.has_keys = f"SELECT m.key FROM {t} m WHERE {_MINE} AND m.key = ANY(%(keys)s)"
        self.messages = (
            f"SELECT m.idx, m.role, m.text, m.key, m.data, m.archived_at FROM {t} m "
            f"WHERE {_MINE} ORDER BY m.idx, m.id"
        )
        self.whole = (
            f"SELECT m.key, m.data, m.archived_at FROM {t} m WHERE {_MINE} "
            "AND m.key = ANY(%(keys)s)"
        )
        self.count_one = (
            f"SELECT coalesce((SELECT messages FROM {t}_conversations WHERE scope = %(scope)s "
            "AND conversation_id = %(cid)s), 0)"
        )
        self.count_all = f"SELECT coalesce(sum(messages), 0) FROM {t}_conversations"
        self.conversations = (
            f"SELECT conversation_id FROM {t}_conversations WHERE messages > 0 "
            'ORDER BY conversation_id COLLATE "C"'
        )
        # -- search --------------------------------------------------------------------
        self.stats = (
            f"WITH c AS (SELECT id, messages, tokens, vectors, vector_seq FROM "
            f"{t}_conversations WHERE scope = %(scope)s AND conversation_id = %(cid)s), "
            "lx AS (SELECT q.n, u.lexeme, u.positions[1] AS pos FROM unnest(%(words)s::text[]) "
            f"WITH ORDINALITY AS q(word, n), unnest(to_tsvector({cfg}, q.word)) AS u) "
            "SELECT c.id, c.messages, c.tokens, c.vectors, c.vector_seq, "
            f"ARRAY(SELECT s.speaker FROM {t}_speakers s WHERE s.conversation = c.id), "
            f"(SELECT value FROM {t}_settings WHERE name = 'embedding_dims'), "
            "lx.n, lx.lexeme, t.in_text, t.in_any, t.in_adj, t.in_all "
            f"FROM c LEFT JOIN lx ON true LEFT JOIN {t}_terms t "
            "ON t.conversation = c.id AND t.term = lx.lexeme ORDER BY lx.n, lx.pos"
        )
        self.rows_at = f"SELECT {_COLUMNS} FROM {t} m WHERE {_MINE} AND m.idx = ANY(%(idx)s)"
        self.vectors = (
            "SELECT array_agg(v.idx ORDER BY v.seq), array_send(array_agg(v.embedding "
            "ORDER BY v.seq)), coalesce(max(v.seq), 0), count(*), "
            f"(SELECT c.vectors FROM {t}_conversations c WHERE c.id = %(conv)s) "
            f"FROM {t}_vectors v WHERE v.conversation = %(conv)s AND v.seq > %(after)s"
        )
        if layout.pgvector is not None:
            near = f"v.embedding {layout.distance} %(query)s::{layout.vector_type}"
            self.nearest = (
                f"SELECT v.idx, 1 - ({near}) FROM {t}_vectors v "
                f"WHERE v.conversation = %(conv)s ORDER BY {near} LIMIT %(n)s"
            )

    @cache  # noqa: B019 - at most 64 strings per archive, kept as long as it is
    def candidates(self, terms: int) -> str:
        """The BM25 candidates of a search of ``terms`` ranked terms, and their replies.

        Parameters: ``q0``, ``idf0``, ... (each term's tsquery and IDF), ``weights`` and
        ``scale`` (``ts_rank_cd``'s column weights, divided by ``scale``), ``avgdl``,
        ``match`` (the scope AND any term), ``newest`` (how many matches are scored),
        ``limit``, ``cover`` (the terms whose containment is reported) and ``replies``.
        The arithmetic is FTS5's, in its order, so equal inputs give equal scores.
        """
        t = self._t
        n = range(terms)
        params = "".join(f", %(q{i})s::tsquery AS q{i}, %(idf{i})s::float8 AS idf{i}" for i in n)
        tfs = "".join(f", ts_rank_cd(p.w, hit.tsv, p.q{i})::float8 * p.scale AS t{i}" for i in n)
        bm25 = "".join(
            f" + p.idf{i} * ((tf.t{i} * (1.2::float8 + 1.0::float8)) / (tf.t{i} + tf.norm))"
            for i in n
        )
        return (
            "WITH p AS MATERIALIZED (SELECT %(weights)s::float4[] AS w, "
            f"%(scale)s::float8 AS scale, %(avgdl)s::float8 AS avgdl{params}), "
            # The newest matches by position: the scope index walks the conversation
            # backwards when matches are common, the GIN index finds them when rare.
            f"hit AS (SELECT m.id, m.idx, m.tsv, m.tokens FROM {t} m WHERE {_MINE} "
            "AND m.tsv @@ %(match)s::tsquery ORDER BY m.idx DESC LIMIT %(newest)s), "
            "tf AS MATERIALIZED (SELECT hit.id, hit.idx, 1.2::float8 * (0.25::float8 + "
            f"0.75::float8 * hit.tokens / p.avgdl) AS norm{tfs} FROM hit, p), "
            f"scored AS (SELECT tf.id, tf.idx, 0::float8{bm25} AS score FROM tf, p), "
            "top AS (SELECT id, idx, score FROM scored ORDER BY score DESC, id "
            "LIMIT %(limit)s) "
            f"SELECT 0, {_COLUMNS}, top.score, ARRAY(SELECT c.n FROM "
            "unnest(%(cover)s::tsquery[]) WITH ORDINALITY AS c(query, n) "
            f"WHERE m.tsv @@ c.query) FROM top JOIN {t} m ON m.id = top.id "
            f"UNION ALL SELECT 1, {_COLUMNS}, 0, NULL FROM {t} m "
            f"WHERE %(replies)s AND {_MINE} AND m.idx IN (SELECT top.idx + 1 FROM top "
            f"JOIN {t} q ON q.id = top.id WHERE strpos(q.text, '?') > 0) "
            "AND m.idx NOT IN (SELECT idx FROM top)"
        )


_COUNTERS = ("in_text", "in_any", "in_adj", "in_all")
