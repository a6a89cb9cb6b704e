-- Rated data: every record's segments, and hourly rollups from which every cost figure is
-- read, so that the cost of a month never scans raw records. Tables that grow with usage
-- lead their keys with the project.

CREATE EXTENSION IF NOT EXISTS btree_gist;

-- Two equally specific contracts (same model, mode and project/provider/region scope) may
-- not overlap in time (COST_MODEL §1.3). Enforced here so that concurrent writes cannot
-- both pass; an unset scope is '' (text fields are never blank, see the API).
ALTER TABLE contracts ADD CONSTRAINT contracts_equally_specific_overlap EXCLUDE USING gist (
    gpu_model WITH =,
    billing_mode WITH =,
    (coalesce(project_id, '')) WITH =,
    (coalesce(provider, '')) WITH =,
    (coalesce(region, '')) WITH =,
    (tstzrange(valid_from, valid_until)) WITH &&
);
CREATE INDEX contracts_by_project ON contracts (project_id) WHERE project_id IS NOT NULL;

-- The pieces of every rated record (one per ledger hour, month and contract validity). They
-- are what re-rating replaces and what undoes a record's contribution to `cost_hourly`.
-- `output_quantity` sits on the record's last segment only: output is booked where the
-- record ends, like the task it completes.
CREATE TABLE rated_segments (
    project_id       text NOT NULL,
    task_id          text NOT NULL,
    attempt          integer NOT NULL,
    seq              integer NOT NULL,
    hour             timestamptz NOT NULL,
    gpu_model        text NOT NULL,
    billing_mode     text NOT NULL,
    outcome          text NOT NULL,
    contract_id      uuid,
    unrated_reason   text CHECK (unrated_reason IN ('no_contract', 'no_fx_rate')),
    output_unit      text,
    gpu_seconds_held numeric NOT NULL,
    gpu_seconds_busy numeric,
    cost             numeric,
    productive       numeric NOT NULL,
    idle             numeric NOT NULL,
    unmeasured       numeric NOT NULL,
    failed           numeric NOT NULL,
    output_quantity  numeric,
    PRIMARY KEY (project_id, task_id, attempt, seq),
    CHECK ((cost IS NULL) = (unrated_reason IS NOT NULL))
);
-- Grouping by label reads a period's segments; re-rating finds them by model and mode.
CREATE INDEX rated_segments_by_hour ON rated_segments (project_id, hour);
CREATE INDEX rated_segments_by_kind ON rated_segments (project_id, gpu_model, billing_mode, hour);

-- What a record adds to the figures counted per record (not per hour): it is booked in the
-- ledger hour holding its `ended_at`. `completes_task` marks the first completed attempt of
-- a task (earliest `ended_at`, then lowest attempt); `fails_task` marks the last attempt
-- (latest `ended_at`, then highest attempt) of a task none of whose attempts completed.
CREATE TABLE rated_records (
    project_id     text NOT NULL,
    task_id        text NOT NULL,
    attempt        integer NOT NULL,
    end_hour       timestamptz NOT NULL,
    gpu_model      text NOT NULL,
    billing_mode   text NOT NULL,
    outcome        text NOT NULL,
    retries        integer NOT NULL,
    failures       integer NOT NULL,
    completes_task boolean NOT NULL,
    fails_task     boolean NOT NULL,
    PRIMARY KEY (project_id, task_id, attempt)
);
CREATE INDEX rated_records_by_end ON rated_records (project_id, end_hour);

-- Sums of segments per project and ledger hour. With `contract_id` in the key it also holds
-- each contract's hourly usage, from which unused commitment is computed at read time.
CREATE TABLE cost_hourly (
    project_id       text NOT NULL,
    hour             timestamptz NOT NULL,
    gpu_model        text NOT NULL,
    billing_mode     text NOT NULL,
    outcome          text NOT NULL,
    contract_id      uuid,
    unrated_reason   text,
    output_unit      text,
    segments         bigint NOT NULL,
    gpu_seconds_held numeric NOT NULL,
    -- Busy time of the segments that measured it; unmeasured ones add nothing.
    gpu_seconds_busy numeric NOT NULL,
    cost             numeric NOT NULL,
    productive       numeric NOT NULL,
    idle             numeric NOT NULL,
    unmeasured       numeric NOT NULL,
    failed           numeric NOT NULL,
    output_quantity  numeric NOT NULL,
    CONSTRAINT cost_hourly_key UNIQUE NULLS NOT DISTINCT
        (project_id, hour, gpu_model, billing_mode, outcome, contract_id, unrated_reason, output_unit)
);

-- Sums of `rated_records` per project and ledger hour of the records' end.
CREATE TABLE records_hourly (
    project_id      text NOT NULL,
    hour            timestamptz NOT NULL,
    gpu_model       text NOT NULL,
    billing_mode    text NOT NULL,
    outcome         text NOT NULL,
    records         bigint NOT NULL,
    retries         bigint NOT NULL,
    failures        bigint NOT NULL,
    tasks_completed bigint NOT NULL,
    tasks_failed    bigint NOT NULL,
    PRIMARY KEY (project_id, hour, gpu_model, billing_mode, outcome)
);
