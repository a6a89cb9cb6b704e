-- A reservation's usage is compacted into one row per contract and UTC day, its hours as
-- arrays, summed over projects. Netting a month of a thousand reservations read hundreds of
-- thousands of hourly rows and grouped them per contract and hour on every report; a day's row
-- holds that grouping already. A project-scoped contract rates only its own project's records,
-- so the project adds nothing to the compacted key.
--
-- `contract_usage_hourly` keeps the delta rows rating appends; compaction folds them into the
-- day's row, and readers add the hours of both, so figures are exact at any moment. The arrays
-- pair up element by element, in hour order, and hold only hours with some segment.
CREATE TABLE contract_usage_daily (
    contract_id uuid NOT NULL,
    day         date NOT NULL,
    hours       timestamptz[] NOT NULL,
    segments    bigint[] NOT NULL,
    used        numeric[] NOT NULL,
    PRIMARY KEY (contract_id, day),
    CHECK (cardinality(hours) = cardinality(segments)
           AND cardinality(hours) = cardinality(used))
);

INSERT INTO contract_usage_daily (contract_id, day, hours, segments, used)
SELECT contract_id, (hour AT TIME ZONE 'UTC')::date,
       array_agg(hour ORDER BY hour), array_agg(segments ORDER BY hour),
       array_agg(used ORDER BY hour)
FROM (
  SELECT contract_id, hour, sum(segments) AS segments, sum(gpu_seconds_held) AS used
  FROM contract_usage_hourly
  WHERE delta = 0
  GROUP BY contract_id, hour
  HAVING sum(segments) <> 0) AS hours
GROUP BY contract_id, (hour AT TIME ZONE 'UTC')::date;

DELETE FROM contract_usage_hourly WHERE delta = 0;
