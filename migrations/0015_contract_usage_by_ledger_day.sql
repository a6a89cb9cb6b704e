-- A reservation's usage is compacted per ledger day (in the time zone the rollups were built
-- for) instead of per UTC day, and each day's row also holds its hours' usage sorted, with
-- running sums. A day whose every hour commits the same GPU-seconds `c` leaves unused
-- `hours × c − Σ least(used, c)`, and with the usage sorted that sum is one binary search:
-- `running[k] + c × (n − k)`, where `k = width_bucket(c, sorted)` counts the hours using at
-- most `c`. A month's report then reads one number per reservation and day instead of every
-- hour.
--
-- Each hour's usage is rounded to 20 decimal places, as every figure reads it, before it is
-- sorted and summed.

CREATE FUNCTION usage_sorted(used numeric[]) RETURNS numeric[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$ SELECT ARRAY(SELECT round(u, 20) FROM unnest(used) AS u ORDER BY 1) $$;

CREATE FUNCTION usage_running_sums(used numeric[]) RETURNS numeric[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $$
  SELECT ARRAY(SELECT sum(v) OVER (ORDER BY n)
               FROM unnest(usage_sorted(used)) WITH ORDINALITY AS e(v, n)
               ORDER BY n)
$$;

ALTER TABLE contract_usage_daily
    ADD COLUMN sorted_used numeric[],
    ADD COLUMN running_used numeric[];

WITH old AS (DELETE FROM contract_usage_daily RETURNING *),
hours AS (
  SELECT old.contract_id, e.hour, e.segments, e.used
  FROM old, unnest(old.hours, old.segments, old.used) AS e(hour, segments, used)),
zone AS (
  SELECT coalesce((SELECT value FROM settings WHERE key = 'rollup_timezone'), 'UTC') AS name)
INSERT INTO contract_usage_daily
    (contract_id, day, hours, segments, used, sorted_used, running_used)
SELECT contract_id, day, hours, segments, used, usage_sorted(used), usage_running_sums(used)
FROM (
  SELECT contract_id, (hour AT TIME ZONE zone.name)::date AS day,
         array_agg(hour ORDER BY hour) AS hours, array_agg(segments ORDER BY hour) AS segments,
         array_agg(used ORDER BY hour) AS used
  FROM hours, zone
  GROUP BY 1, 2) AS days;

ALTER TABLE contract_usage_daily
    ALTER COLUMN sorted_used SET NOT NULL,
    ALTER COLUMN running_used SET NOT NULL,
    ADD CHECK (cardinality(sorted_used) = cardinality(used)
               AND cardinality(running_used) = cardinality(used));
