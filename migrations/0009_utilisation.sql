-- What DCGM measured of a record, and the sums the utilisation figures are read from.
--
-- A job record may carry GPU-Util, SM, tensor and DRAM activity (time-averages over its held
-- time, per GPU, from 0 to 1), its peak memory per GPU with the memory of the GPU or slice,
-- and the MIG profile it ran on (then `gpu_count` counts slices). All are optional; a record
-- without them is stored, rated and hashed as before.
ALTER TABLE job_records
    ADD COLUMN gpu_util         numeric CHECK (gpu_util BETWEEN 0 AND 1),
    ADD COLUMN sm_active        numeric CHECK (sm_active BETWEEN 0 AND 1),
    ADD COLUMN tensor_active    numeric CHECK (tensor_active BETWEEN 0 AND 1),
    ADD COLUMN dram_active      numeric CHECK (dram_active BETWEEN 0 AND 1),
    ADD COLUMN memory_peak_gib  numeric CHECK (memory_peak_gib >= 0),
    ADD COLUMN memory_total_gib numeric CHECK (memory_total_gib > 0),
    ADD COLUMN mig_profile      text,
    ADD CONSTRAINT job_records_memory_peak_within_total
        CHECK (memory_peak_gib <= memory_total_gib);

-- Each segment carries its record's telemetry, so that the utilisation sums of a segment
-- can be taken back exactly when it is re-rated, and grouped by label like its cost.
-- `memory_used_share` is memory_peak / memory_total; `mig_slices` the profile's compute
-- slices of 7, by which a reserved card's usage is counted.
ALTER TABLE rated_segments
    ADD COLUMN gpu_util          numeric,
    ADD COLUMN sm_active         numeric,
    ADD COLUMN tensor_active     numeric,
    ADD COLUMN dram_active       numeric,
    ADD COLUMN memory_used_share numeric,
    ADD COLUMN mig_slices        smallint;

-- Utilisation sums, per ledger hour, day and month, kept by rating like the cost rollups
-- (delta rows, compacted): for each metric, the GPU-seconds held by segments that report it
-- (`*_held`) and the sum of held × metric (`*_weighted`); the cost of segments that look
-- busy (GPU-Util ≥ 0.8 with SM active < 0.4); and the cost of the memory nobody used,
-- cost × (1 − memory_used_share). Only segments with some telemetry have rows here.
CREATE TABLE util_hourly (
    project_id             text NOT NULL,
    hour                   timestamptz NOT NULL,
    gpu_model              text NOT NULL,
    billing_mode           text NOT NULL,
    outcome                text NOT NULL,
    segments               bigint NOT NULL,
    gpu_util_held          numeric NOT NULL,
    gpu_util_weighted      numeric NOT NULL,
    sm_active_held         numeric NOT NULL,
    sm_active_weighted     numeric NOT NULL,
    tensor_active_held     numeric NOT NULL,
    tensor_active_weighted numeric NOT NULL,
    dram_active_held       numeric NOT NULL,
    dram_active_weighted   numeric NOT NULL,
    memory_held            numeric NOT NULL,
    memory_used_weighted   numeric NOT NULL,
    looks_busy_cost        numeric NOT NULL,
    unused_memory_cost     numeric NOT NULL,
    delta                  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, hour, gpu_model, billing_mode, outcome, delta)
);
CREATE INDEX util_hourly_deltas ON util_hourly (delta) WHERE delta <> 0;

CREATE TABLE util_daily (LIKE util_hourly INCLUDING DEFAULTS);
ALTER TABLE util_daily RENAME COLUMN hour TO day;
ALTER TABLE util_daily ALTER COLUMN day TYPE date;
ALTER TABLE util_daily ADD PRIMARY KEY (project_id, day, gpu_model, billing_mode, outcome, delta);
CREATE INDEX util_daily_deltas ON util_daily (delta) WHERE delta <> 0;

CREATE TABLE util_monthly (LIKE util_hourly INCLUDING DEFAULTS);
ALTER TABLE util_monthly RENAME COLUMN hour TO month;
ALTER TABLE util_monthly ALTER COLUMN month TYPE date;
ALTER TABLE util_monthly ADD CONSTRAINT util_monthly_first_day CHECK (extract(day FROM month) = 1);
ALTER TABLE util_monthly ADD PRIMARY KEY (project_id, month, gpu_model, billing_mode, outcome, delta);
CREATE INDEX util_monthly_deltas ON util_monthly (delta) WHERE delta <> 0;
