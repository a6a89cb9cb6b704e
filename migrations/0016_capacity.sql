-- Capacity: the GPUs that are paid for, with or without a job on them.
--
-- A pool groups nodes (a nodepool, a Slurm partition, any group) and says who pays for the
-- time its nodes sit idle or down. A node is known over intervals, each `up` or `down`;
-- intervals of one node never overlap (the writer holds the node's advisory lock while it
-- checks), and `(node, from_at)` identifies one: re-sending it is idempotent.
--
-- Job records may name the nodes they ran on; their held time is spread evenly over them.
-- What the pools' figures are (paid = used + idle + down per ledger hour and node) is worked
-- out when read, from these rows and the rated segments.

CREATE TABLE pools (
    id                   text PRIMARY KEY CHECK (id ~ '^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$'),
    name                 text NOT NULL,
    owner_project        text REFERENCES projects (id),
    share_idle           text NOT NULL CHECK (share_idle IN ('owner', 'by_usage', 'pool')),
    zombie_after_minutes integer CHECK (zombie_after_minutes > 0),
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT pools_owner_share CHECK (share_idle <> 'owner' OR owner_project IS NOT NULL)
);

CREATE TABLE capacity_intervals (
    node         text NOT NULL,
    from_at      timestamptz NOT NULL,
    until_at     timestamptz NOT NULL CHECK (until_at > from_at),
    pool_id      text NOT NULL REFERENCES pools (id),
    state        text NOT NULL CHECK (state IN ('up', 'down')),
    gpu_model    text NOT NULL,
    gpus         integer NOT NULL CHECK (gpus > 0),
    billing_mode text NOT NULL CHECK (billing_mode IN ('on_demand', 'spot', 'reserved')),
    provider     text,
    region       text,
    labels       jsonb NOT NULL DEFAULT '{}',
    content_hash bytea NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node, from_at)
);
CREATE INDEX capacity_intervals_by_pool ON capacity_intervals (pool_id, from_at, until_at);
CREATE INDEX capacity_intervals_by_time ON capacity_intervals (until_at, from_at);

-- The nodes a record ran on, sorted; null when it named none. Capacity reads the records
-- that name nodes by time.
ALTER TABLE job_records ADD COLUMN nodes text[] CHECK (cardinality(nodes) > 0);
CREATE INDEX job_records_on_nodes ON job_records (ended_at, started_at) WHERE nodes IS NOT NULL;

-- Idle stretches of a node that have been alerted: one per stretch, kept when later records
-- fill it. `judged_until` is how far the stretch was known to be idle when it fired.
CREATE TABLE zombie_stretches (
    node          text NOT NULL,
    since         timestamptz NOT NULL,
    judged_until  timestamptz NOT NULL,
    pool_id       text NOT NULL REFERENCES pools (id),
    gpu_model     text NOT NULL,
    gpus          integer NOT NULL,
    currency      char(3),
    cost_per_hour numeric,
    cost_so_far   numeric,
    fired_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node, since)
);

-- A zombie alert reaches the pool owner's project through the same outbox as the others.
ALTER TABLE alert_events
    DROP CONSTRAINT alert_events_kind_check,
    ADD CONSTRAINT alert_events_kind_check
        CHECK (kind IN ('actual', 'forecast', 'idle_gpu', 'zombie_capacity')),
    DROP CONSTRAINT alert_events_budget_fields,
    ADD CONSTRAINT alert_events_budget_fields CHECK (
        kind IN ('idle_gpu', 'zombie_capacity')
        OR (threshold IS NOT NULL AND spend IS NOT NULL AND budget IS NOT NULL
            AND burn_pct IS NOT NULL AND task_id IS NULL)),
    ADD COLUMN node          text,
    ADD COLUMN pool_id       text,
    ADD COLUMN since         timestamptz,
    ADD COLUMN cost_per_hour numeric,
    ADD CONSTRAINT alert_events_zombie_fields CHECK (
        kind <> 'zombie_capacity'
        OR (threshold IS NULL AND node IS NOT NULL AND pool_id IS NOT NULL
            AND since IS NOT NULL AND gpu_model IS NOT NULL AND gpu_count IS NOT NULL));
CREATE UNIQUE INDEX alert_events_zombie_once ON alert_events (project_id, node, since)
    WHERE kind = 'zombie_capacity';
