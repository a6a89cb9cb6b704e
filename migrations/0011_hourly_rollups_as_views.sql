-- The hourly rollups become views over the rows they summed. Keeping them as tables cost
-- every rating call about one rollup row per segment (a record makes one segment per hour it
-- touches), and compaction its largest fold; yet a period reads hourly rows only for the hours
-- outside its whole days, a few dozen hours of one project, which the segments' index by
-- project and hour reads as fast. Whole days and months are still read from the daily and
-- monthly rollups, which rating keeps up to date as before. Like every rollup, the views have
-- one row per summed row: readers sum the rows of a key.
DROP TABLE cost_hourly;
DROP TABLE records_hourly;
DROP TABLE util_hourly;

CREATE VIEW cost_hourly AS
SELECT project_id, hour, gpu_model, billing_mode, outcome, contract_id, unrated_reason,
       output_unit, 1::bigint AS segments, gpu_seconds_held,
       coalesce(gpu_seconds_busy, 0) AS gpu_seconds_busy, coalesce(cost, 0) AS cost,
       productive, idle, unmeasured, failed, coalesce(output_quantity, 0) AS output_quantity
FROM rated_segments;

CREATE VIEW records_hourly AS
SELECT project_id, end_hour AS hour, gpu_model, billing_mode, outcome, 1::bigint AS records,
       retries::bigint AS retries, failures::bigint AS failures,
       completes_task::int::bigint AS tasks_completed, fails_task::int::bigint AS tasks_failed
FROM rated_records;

-- Segments that carry some telemetry, with the utilisation sums of `util_daily` per segment.
-- A record looks busy at GPU-Util of at least 0.8 with SMs active less than 0.4 of the time.
CREATE VIEW util_hourly AS
SELECT project_id, hour, gpu_model, billing_mode, outcome, 1::bigint AS segments,
       CASE WHEN gpu_util IS NULL THEN 0 ELSE gpu_seconds_held END AS gpu_util_held,
       coalesce(gpu_seconds_held * gpu_util, 0) AS gpu_util_weighted,
       CASE WHEN sm_active IS NULL THEN 0 ELSE gpu_seconds_held END AS sm_active_held,
       coalesce(gpu_seconds_held * sm_active, 0) AS sm_active_weighted,
       CASE WHEN tensor_active IS NULL THEN 0 ELSE gpu_seconds_held END AS tensor_active_held,
       coalesce(gpu_seconds_held * tensor_active, 0) AS tensor_active_weighted,
       CASE WHEN dram_active IS NULL THEN 0 ELSE gpu_seconds_held END AS dram_active_held,
       coalesce(gpu_seconds_held * dram_active, 0) AS dram_active_weighted,
       CASE WHEN memory_used_share IS NULL THEN 0 ELSE gpu_seconds_held END AS memory_held,
       coalesce(gpu_seconds_held * memory_used_share, 0) AS memory_used_weighted,
       CASE WHEN gpu_util >= 0.8 AND sm_active < 0.4 THEN coalesce(cost, 0) ELSE 0 END
           AS looks_busy_cost,
       coalesce(cost * (1 - memory_used_share), 0) AS unused_memory_cost
FROM rated_segments
WHERE num_nonnulls(gpu_util, sm_active, tensor_active, dram_active, memory_used_share) > 0;

-- Re-rating after a contract change finds the records of the contract's model and mode by
-- their own times (`job_records_by_start`), so the segments need no index by model and mode:
-- one index fewer to write per segment.
DROP INDEX rated_segments_by_kind;
