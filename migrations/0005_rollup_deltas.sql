-- Rollups that writers never wait on, and a daily level that keeps a month's read small.
--
-- Rating no longer updates rollup rows in place: every call appends its changes as rows
-- tagged with a fresh `delta` number, so concurrent transactions never touch the same row.
-- Rows with `delta = 0` are compacted sums; a background compaction folds the delta rows
-- into them. A figure is always the sum of every row of its key, compacted or not, so reads
-- are exact at any moment.
--
-- `cost_daily` and `records_daily` hold the same sums per ledger day (the date in the ledger
-- time zone), and `cost_monthly` and `records_monthly` per ledger month (its first day), so
-- that a period is read from a bounded number of rows whatever the volume: its whole months
-- from the monthly tables, its other whole days from the daily ones, and the hours left over
-- from the hourly ones.
-- `contract_usage_hourly` holds the GPU-seconds each reserved contract rated per project and
-- hour, from which unused commitment is computed.

CREATE SEQUENCE rollup_deltas;

ALTER TABLE cost_hourly DROP CONSTRAINT cost_hourly_key;
ALTER TABLE cost_hourly ADD COLUMN delta bigint NOT NULL DEFAULT 0;
ALTER TABLE cost_hourly ADD CONSTRAINT cost_hourly_key UNIQUE NULLS NOT DISTINCT
    (project_id, hour, gpu_model, billing_mode, outcome, contract_id, unrated_reason,
     output_unit, delta);
CREATE INDEX cost_hourly_deltas ON cost_hourly (delta) WHERE delta <> 0;

ALTER TABLE records_hourly DROP CONSTRAINT records_hourly_pkey;
ALTER TABLE records_hourly ADD COLUMN delta bigint NOT NULL DEFAULT 0;
ALTER TABLE records_hourly ADD PRIMARY KEY
    (project_id, hour, gpu_model, billing_mode, outcome, delta);
CREATE INDEX records_hourly_deltas ON records_hourly (delta) WHERE delta <> 0;

CREATE TABLE cost_daily (
    project_id       text NOT NULL,
    day              date NOT NULL,
    gpu_model        text NOT NULL,
    billing_mode     text NOT NULL,
    outcome          text NOT NULL,
    contract_id      uuid,
    unrated_reason   text,
    output_unit      text,
    segments         bigint NOT NULL,
    gpu_seconds_held numeric NOT NULL,
    gpu_seconds_busy numeric NOT NULL,
    cost             numeric NOT NULL,
    productive       numeric NOT NULL,
    idle             numeric NOT NULL,
    unmeasured       numeric NOT NULL,
    failed           numeric NOT NULL,
    output_quantity  numeric NOT NULL,
    delta            bigint NOT NULL DEFAULT 0,
    CONSTRAINT cost_daily_key UNIQUE NULLS NOT DISTINCT
        (project_id, day, gpu_model, billing_mode, outcome, contract_id, unrated_reason,
         output_unit, delta)
);
CREATE INDEX cost_daily_deltas ON cost_daily (delta) WHERE delta <> 0;

CREATE TABLE records_daily (
    project_id      text NOT NULL,
    day             date NOT NULL,
    gpu_model       text NOT NULL,
    billing_mode    text NOT NULL,
    outcome         text NOT NULL,
    records         bigint NOT NULL,
    retries         bigint NOT NULL,
    failures        bigint NOT NULL,
    tasks_completed bigint NOT NULL,
    tasks_failed    bigint NOT NULL,
    delta           bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, day, gpu_model, billing_mode, outcome, delta)
);
CREATE INDEX records_daily_deltas ON records_daily (delta) WHERE delta <> 0;

CREATE TABLE cost_monthly (
    project_id       text NOT NULL,
    month            date NOT NULL CHECK (extract(day FROM month) = 1),
    gpu_model        text NOT NULL,
    billing_mode     text NOT NULL,
    outcome          text NOT NULL,
    contract_id      uuid,
    unrated_reason   text,
    output_unit      text,
    segments         bigint NOT NULL,
    gpu_seconds_held numeric NOT NULL,
    gpu_seconds_busy numeric NOT NULL,
    cost             numeric NOT NULL,
    productive       numeric NOT NULL,
    idle             numeric NOT NULL,
    unmeasured       numeric NOT NULL,
    failed           numeric NOT NULL,
    output_quantity  numeric NOT NULL,
    delta            bigint NOT NULL DEFAULT 0,
    CONSTRAINT cost_monthly_key UNIQUE NULLS NOT DISTINCT
        (project_id, month, gpu_model, billing_mode, outcome, contract_id, unrated_reason,
         output_unit, delta)
);
CREATE INDEX cost_monthly_deltas ON cost_monthly (delta) WHERE delta <> 0;

CREATE TABLE records_monthly (
    project_id      text NOT NULL,
    month           date NOT NULL CHECK (extract(day FROM month) = 1),
    gpu_model       text NOT NULL,
    billing_mode    text NOT NULL,
    outcome         text NOT NULL,
    records         bigint NOT NULL,
    retries         bigint NOT NULL,
    failures        bigint NOT NULL,
    tasks_completed bigint NOT NULL,
    tasks_failed    bigint NOT NULL,
    delta           bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, month, gpu_model, billing_mode, outcome, delta)
);
CREATE INDEX records_monthly_deltas ON records_monthly (delta) WHERE delta <> 0;

CREATE TABLE contract_usage_hourly (
    contract_id      uuid NOT NULL,
    hour             timestamptz NOT NULL,
    project_id       text NOT NULL,
    segments         bigint NOT NULL,
    gpu_seconds_held numeric NOT NULL,
    delta            bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (contract_id, hour, project_id, delta)
);
CREATE INDEX contract_usage_hourly_deltas ON contract_usage_hourly (delta) WHERE delta <> 0;

INSERT INTO contract_usage_hourly (contract_id, hour, project_id, segments, gpu_seconds_held)
SELECT contract_id, hour, project_id, sum(segments), sum(gpu_seconds_held)
FROM cost_hourly
WHERE contract_id IS NOT NULL AND billing_mode = 'reserved'
GROUP BY contract_id, hour, project_id;

-- One row per task, locked by whoever rates one of its attempts, so that two transactions
-- rating attempts of the same task see each other's records. Row locks, unlike advisory
-- locks, take no room in the shared lock table, however many tasks a batch holds.
CREATE TABLE tasks (
    project_id text NOT NULL,
    task_id    text NOT NULL,
    PRIMARY KEY (project_id, task_id)
);
INSERT INTO tasks SELECT DISTINCT project_id, task_id FROM job_records;

-- The ledger time zone the daily and monthly rollups were built in is kept in `settings`
-- (`rollup_timezone`); the service rebuilds them when it starts in another one.
