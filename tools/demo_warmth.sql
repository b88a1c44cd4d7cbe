-- The demo's warmth checked against its own ledger: sqlite3 var/demo/demo.db < tools/demo_warmth.sql
--
-- Judges every placement again from the ledger rows alone: exact when an earlier
-- placement (lower id: the watcher's order) of the same label ran on the same node
-- within the recency window (the default 7-day half-life, weight >= 0.1:
-- 7 * log2(10) = 23.25 days); partial when one of a label sharing a leading run of
-- segments, that is its first segment, did; cold otherwise. Then compares with the
-- warmth the watcher recorded. No node is replaced in the demo and nobody edits its
-- counts, the two other things the ledger's warmth takes into account.
WITH judged AS (
  SELECT p.warmth AS ledger,
    CASE
      WHEN EXISTS (SELECT 1 FROM history_placement q
                   WHERE q.node = p.node AND q.id < p.id AND q.label = p.label
                     AND julianday(p.bound_at) - julianday(q.bound_at) <= 23.25)
        THEN 'exact'
      WHEN EXISTS (SELECT 1 FROM history_placement q
                   WHERE q.node = p.node AND q.id < p.id
                     AND julianday(p.bound_at) - julianday(q.bound_at) <= 23.25
                     AND substr(q.label || '-', 1, instr(p.label || '-', '-'))
                         = substr(p.label || '-', 1, instr(p.label || '-', '-')))
        THEN 'partial'
      ELSE 'cold'
    END AS recomputed
  FROM history_placement p
)
SELECT COUNT(*) AS placements,
       SUM(ledger = 'exact') AS ledger_exact,
       SUM(recomputed = 'exact') AS recomputed_exact,
       ROUND(100.0 * SUM(ledger = 'exact') / COUNT(*), 1) AS ledger_exact_pct,
       ROUND(100.0 * SUM(recomputed = 'exact') / COUNT(*), 1) AS recomputed_exact_pct,
       SUM(ledger <> recomputed) AS disagreements
FROM judged;
