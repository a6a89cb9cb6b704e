-- Prices and FX rates are applied when a figure is read, not when a record is rated.
--
-- What rating stores in place of money is card-seconds: the GPU-seconds a price applies to
-- (a MIG slice's scaled by its share g/7 of the card), split into the same parts as a cost
-- (productive, idle, unmeasured, failed), kept for GPU time no contract prices as well, so
-- that a what-if price for its model and mode can price it. A figure is then
-- Σ card-seconds × price × FX rate ÷ 3600 over the rows of each contract and ledger month,
-- worked out by the statement that reads it. A change of a contract's price or of an FX rate
-- writes one row and is seen by the next read; only changes that move which contract prices
-- which hours (creation, deletion, model, mode, validity, scope) re-assign segments.
--
-- Whether a segment lacks an FX rate is known only when it is read: rating stores
-- `no_contract` alone, and a rated segment whose contract's currency has no rate into the
-- project's for the month is read as unrated `no_fx_rate`.
--
-- Every table whose rows carry money gains the contract (and the model and billing mode a
-- what-if price may name), so that each row has one price. The daily, monthly and per-task sums are emptied here and rebuilt from the segments
-- when the service starts (the setting naming the time zone they were built in is removed).

ALTER TABLE rated_segments RENAME COLUMN cost TO card_seconds;
ALTER TABLE rated_segments RENAME COLUMN productive TO productive_seconds;
ALTER TABLE rated_segments RENAME COLUMN idle TO idle_seconds;
ALTER TABLE rated_segments RENAME COLUMN unmeasured TO unmeasured_seconds;
ALTER TABLE rated_segments RENAME COLUMN failed TO failed_seconds;
ALTER TABLE rated_segments DROP CONSTRAINT rated_segments_check;
ALTER TABLE rated_segments DROP CONSTRAINT rated_segments_unrated_reason_check;

-- The divisors' scale keeps 24 decimal places in the quotients.
UPDATE rated_segments s
SET unrated_reason = CASE WHEN contract_id IS NULL THEN 'no_contract' END,
    card_seconds = c.card_seconds,
    productive_seconds = CASE WHEN c.split = 'productive' THEN c.productive ELSE 0 END,
    idle_seconds = CASE WHEN c.split = 'productive' THEN c.card_seconds - c.productive ELSE 0 END,
    unmeasured_seconds = CASE WHEN c.split = 'unmeasured' THEN c.card_seconds ELSE 0 END,
    failed_seconds = CASE WHEN c.split = 'failed' THEN c.card_seconds ELSE 0 END
FROM (
    SELECT project_id, task_id, attempt, seq, card_seconds,
           CASE WHEN outcome <> 'completed' THEN 'failed'
                WHEN gpu_seconds_busy IS NULL THEN 'unmeasured'
                ELSE 'productive' END AS split,
           CASE WHEN gpu_seconds_held = 0 THEN 0
                ELSE round(card_seconds * gpu_seconds_busy
                           / (gpu_seconds_held * 1.000000000000000000000000), 24) END
               AS productive
    FROM (SELECT project_id, task_id, attempt, seq, outcome, gpu_seconds_held,
                 gpu_seconds_busy,
                 CASE WHEN mig_slices IS NULL THEN gpu_seconds_held
                      ELSE round(gpu_seconds_held * mig_slices / 7.000000000000000000000000, 24)
                 END AS card_seconds
          FROM rated_segments) AS r
) AS c
WHERE (s.project_id, s.task_id, s.attempt, s.seq) = (c.project_id, c.task_id, c.attempt, c.seq);

ALTER TABLE rated_segments ADD CONSTRAINT rated_segments_unrated_reason_check
    CHECK (unrated_reason = 'no_contract');
ALTER TABLE rated_segments ADD CONSTRAINT rated_segments_priced_by_a_contract
    CHECK ((contract_id IS NULL) = (unrated_reason IS NOT NULL) AND card_seconds IS NOT NULL);

-- The views over the segments are rebuilt with the new columns.
DROP VIEW cost_hourly;
DROP VIEW util_hourly;
DROP VIEW task_hourly;

CREATE VIEW cost_hourly AS
SELECT project_id, hour, gpu_model, billing_mode, outcome, contract_id, unrated_reason,
       output_unit, 1::bigint AS segments, gpu_seconds_held,
       coalesce(gpu_seconds_busy, 0) AS gpu_seconds_busy,
       coalesce(card_seconds, 0) AS card_seconds, productive_seconds, idle_seconds,
       unmeasured_seconds, failed_seconds, coalesce(output_quantity, 0) AS output_quantity
FROM rated_segments;

CREATE VIEW util_hourly AS
SELECT project_id, hour, gpu_model, billing_mode, outcome, contract_id, 1::bigint AS segments,
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
       CASE WHEN gpu_util >= 0.8 AND sm_active < 0.4 THEN coalesce(card_seconds, 0) ELSE 0 END
           AS looks_busy_seconds,
       coalesce(card_seconds * (1 - memory_used_share), 0) AS unused_memory_seconds
FROM rated_segments
WHERE num_nonnulls(gpu_util, sm_active, tensor_active, dram_active, memory_used_share) > 0;

-- A task's rows are kept per contract, model and billing mode too (a contract has one model
-- and mode, so these add no rows); the per-record counts sit on rows of their own (no
-- contract, model or mode).
CREATE VIEW task_hourly AS
SELECT project_id, task_id, hour, contract_id, gpu_model, billing_mode,
       1 AS segments, coalesce(card_seconds, 0) AS card_seconds, productive_seconds,
       idle_seconds, unmeasured_seconds, failed_seconds,
       gpu_seconds_held, coalesce(gpu_seconds_busy, 0) AS gpu_seconds_busy,
       CASE WHEN contract_id IS NULL THEN gpu_seconds_held ELSE 0 END AS unrated_gpu_seconds,
       CASE WHEN output_quantity IS NULL THEN '{}'::jsonb
            ELSE jsonb_build_object(output_unit, output_quantity) END AS output,
       0 AS attempts, 0 AS failed_attempts, 0 AS retries, 0 AS failures,
       0 AS queue_wait_seconds, 0 AS queue_waits
FROM rated_segments
UNION ALL
SELECT project_id, task_id, end_hour, NULL::uuid, NULL::text, NULL::text,
       0, 0, 0, 0, 0, 0, 0, 0, 0, '{}'::jsonb,
       1, (outcome <> 'completed')::int, retries, failures,
       coalesce(queue_wait_seconds, 0), (queue_wait_seconds IS NOT NULL)::int
FROM rated_records;

-- The sums are emptied, their columns renamed and keyed by contract, and rebuilt at start.
TRUNCATE cost_daily, cost_monthly, cost_monthly_kinds, util_daily, util_monthly, task_monthly;
DELETE FROM settings WHERE key = 'rollup_timezone';

ALTER TABLE cost_daily RENAME COLUMN cost TO card_seconds;
ALTER TABLE cost_daily RENAME COLUMN productive TO productive_seconds;
ALTER TABLE cost_daily RENAME COLUMN idle TO idle_seconds;
ALTER TABLE cost_daily RENAME COLUMN unmeasured TO unmeasured_seconds;
ALTER TABLE cost_daily RENAME COLUMN failed TO failed_seconds;
ALTER TABLE cost_monthly RENAME COLUMN cost TO card_seconds;
ALTER TABLE cost_monthly RENAME COLUMN productive TO productive_seconds;
ALTER TABLE cost_monthly RENAME COLUMN idle TO idle_seconds;
ALTER TABLE cost_monthly RENAME COLUMN unmeasured TO unmeasured_seconds;
ALTER TABLE cost_monthly RENAME COLUMN failed TO failed_seconds;

-- Every project's month by what a figure tells apart, and by contract, model and mode.
ALTER TABLE cost_monthly_kinds RENAME COLUMN cost TO card_seconds;
ALTER TABLE cost_monthly_kinds RENAME COLUMN productive TO productive_seconds;
ALTER TABLE cost_monthly_kinds RENAME COLUMN idle TO idle_seconds;
ALTER TABLE cost_monthly_kinds RENAME COLUMN unmeasured TO unmeasured_seconds;
ALTER TABLE cost_monthly_kinds RENAME COLUMN failed TO failed_seconds;
ALTER TABLE cost_monthly_kinds DROP CONSTRAINT cost_monthly_kinds_key;
ALTER TABLE cost_monthly_kinds
    ADD COLUMN contract_id uuid,
    ADD COLUMN billing_mode text;
ALTER TABLE cost_monthly_kinds ADD CONSTRAINT cost_monthly_kinds_key UNIQUE NULLS NOT DISTINCT
    (month, project_id, completed, unrated_reason, contract_id, gpu_model, billing_mode,
     output_unit);

ALTER TABLE util_daily RENAME COLUMN looks_busy_cost TO looks_busy_seconds;
ALTER TABLE util_daily RENAME COLUMN unused_memory_cost TO unused_memory_seconds;
ALTER TABLE util_monthly RENAME COLUMN looks_busy_cost TO looks_busy_seconds;
ALTER TABLE util_monthly RENAME COLUMN unused_memory_cost TO unused_memory_seconds;
ALTER TABLE util_daily DROP CONSTRAINT util_daily_pkey;
ALTER TABLE util_monthly DROP CONSTRAINT util_monthly_pkey;
ALTER TABLE util_daily ADD COLUMN contract_id uuid;
ALTER TABLE util_monthly ADD COLUMN contract_id uuid;
ALTER TABLE util_daily ADD CONSTRAINT util_daily_key UNIQUE NULLS NOT DISTINCT
    (project_id, day, gpu_model, billing_mode, outcome, contract_id, delta);
ALTER TABLE util_monthly ADD CONSTRAINT util_monthly_key UNIQUE NULLS NOT DISTINCT
    (project_id, month, gpu_model, billing_mode, outcome, contract_id, delta);

DROP INDEX task_monthly_by_cost;
ALTER TABLE task_monthly RENAME COLUMN cost TO card_seconds;
ALTER TABLE task_monthly RENAME COLUMN productive TO productive_seconds;
ALTER TABLE task_monthly RENAME COLUMN idle TO idle_seconds;
ALTER TABLE task_monthly RENAME COLUMN unmeasured TO unmeasured_seconds;
ALTER TABLE task_monthly RENAME COLUMN failed TO failed_seconds;
ALTER TABLE task_monthly DROP CONSTRAINT task_monthly_pkey;
ALTER TABLE task_monthly
    ADD COLUMN contract_id uuid,
    ADD COLUMN gpu_model text,
    ADD COLUMN billing_mode text;
ALTER TABLE task_monthly ADD CONSTRAINT task_monthly_key UNIQUE NULLS NOT DISTINCT
    (project_id, month, task_id, contract_id, gpu_model, billing_mode);

-- Re-assignments that a change of which contract prices which hours still owes (see
-- docs/cost-model.md, "When prices apply"). The change stores its job in its own transaction;
-- the job re-rates the records it names page by page, each page in a transaction of its own,
-- and is removed when done. A job left by a stopped service is finished at the next start.
-- `after_*` is the last record key done.
CREATE TABLE rerating_jobs (
    id           uuid PRIMARY KEY,
    gpu_model    text NOT NULL,
    billing_mode text NOT NULL,
    project_id   text,
    span_from    timestamptz NOT NULL,
    span_until   timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    after_project text,
    after_task    text,
    after_attempt integer
);
