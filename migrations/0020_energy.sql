-- Energy per task. A record may carry the energy its GPUs used (`energy_joules`); rating
-- spreads it over the record's segments like its GPU-seconds and splits it into the parts of
-- a cost (productive, idle, unmeasured, failed) as it splits the card-seconds.
--
-- Money stays applied when read. For a contract priced by an owned card's TCO, GPU time whose
-- energy was measured is charged the measured energy at PUE × electricity price in place of
-- the power part of its price. So each sum of card-seconds gains two sums beside it: the
-- card-seconds whose energy was measured (`*_metered`, which the power part no longer
-- prices) and the joules measured (`*_joules`). A figure is then
--   Σ (seconds × price − metered × power price + joules × energy price ÷ 1000) ÷ 3600
-- over its rows, each price converted at the month's FX rate. On contracts with a plain
-- price both energy prices are 0 and the figure is what it was.

ALTER TABLE job_records ADD COLUMN energy_joules numeric CHECK (energy_joules >= 0);

ALTER TABLE rated_segments
    ADD COLUMN energy_joules numeric,
    ADD COLUMN productive_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_joules numeric NOT NULL DEFAULT 0;

-- The segments whose energy was measured, read for energy and emissions figures.
CREATE INDEX rated_segments_metered ON rated_segments (project_id, hour)
    WHERE energy_joules IS NOT NULL;

ALTER TABLE cost_daily
    ADD COLUMN metered_card_seconds numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN energy_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_joules numeric NOT NULL DEFAULT 0;
ALTER TABLE cost_monthly
    ADD COLUMN metered_card_seconds numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN energy_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_joules numeric NOT NULL DEFAULT 0;
ALTER TABLE cost_monthly_kinds
    ADD COLUMN metered_card_seconds numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN energy_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_joules numeric NOT NULL DEFAULT 0;
ALTER TABLE task_monthly
    ADD COLUMN metered_card_seconds numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_metered numeric NOT NULL DEFAULT 0,
    ADD COLUMN energy_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN productive_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN idle_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN unmeasured_joules numeric NOT NULL DEFAULT 0,
    ADD COLUMN failed_joules numeric NOT NULL DEFAULT 0;

CREATE OR REPLACE VIEW cost_hourly AS
SELECT project_id, hour, gpu_model, billing_mode, outcome, contract_id, unrated_reason,
       output_unit, 1::bigint AS segments, gpu_seconds_held,
       coalesce(gpu_seconds_busy, 0) AS gpu_seconds_busy,
       coalesce(card_seconds, 0) AS card_seconds, productive_seconds, idle_seconds,
       unmeasured_seconds, failed_seconds, coalesce(output_quantity, 0) AS output_quantity,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE coalesce(card_seconds, 0) END
           AS metered_card_seconds,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE productive_seconds END AS productive_metered,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE idle_seconds END AS idle_metered,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE unmeasured_seconds END AS unmeasured_metered,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE failed_seconds END AS failed_metered,
       coalesce(energy_joules, 0) AS energy_joules, productive_joules, idle_joules,
       unmeasured_joules, failed_joules
FROM rated_segments;

CREATE OR REPLACE VIEW task_hourly AS
SELECT project_id, task_id, hour, contract_id, gpu_model, billing_mode,
       1 AS segments, coalesce(card_seconds, 0) AS card_seconds, productive_seconds,
       idle_seconds, unmeasured_seconds, failed_seconds,
       gpu_seconds_held, coalesce(gpu_seconds_busy, 0) AS gpu_seconds_busy,
       CASE WHEN contract_id IS NULL THEN gpu_seconds_held ELSE 0 END AS unrated_gpu_seconds,
       CASE WHEN output_quantity IS NULL THEN '{}'::jsonb
            ELSE jsonb_build_object(output_unit, output_quantity) END AS output,
       0 AS attempts, 0 AS failed_attempts, 0 AS retries, 0 AS failures,
       0 AS queue_wait_seconds, 0 AS queue_waits,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE coalesce(card_seconds, 0) END
           AS metered_card_seconds,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE productive_seconds END AS productive_metered,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE idle_seconds END AS idle_metered,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE unmeasured_seconds END AS unmeasured_metered,
       CASE WHEN energy_joules IS NULL THEN 0 ELSE failed_seconds END AS failed_metered,
       coalesce(energy_joules, 0) AS energy_joules, productive_joules, idle_joules,
       unmeasured_joules, failed_joules
FROM rated_segments
UNION ALL
SELECT project_id, task_id, end_hour, NULL::uuid, NULL::text, NULL::text,
       0, 0, 0, 0, 0, 0, 0, 0, 0, '{}'::jsonb,
       1, (outcome <> 'completed')::int, retries, failures,
       coalesce(queue_wait_seconds, 0), (queue_wait_seconds IS NOT NULL)::int,
       0, 0, 0, 0, 0, 0, 0, 0, 0, 0
FROM rated_records;
