-- Cloud bills (FOCUS): what a provider charged, row by row, reconciled with capacity.
--
-- A bill file holds statements: one provider's billing account in one billing period. A
-- statement posted again with the same rows is a duplicate; with other rows it replaces
-- what was stored for it (rows, and the capacity the old rows created), in one transaction
-- under the statement's advisory lock.
--
-- A statement's rows of one resource are kept as runs as well: charges following each other,
-- each as long and at the same cost (a month of hourly rows of one instance is one run), so
-- that a read fetches runs, not rows. A run's resource is matched to nodes when figures are
-- read, by keys: the resource id lower-cased without scheme, and its last segment
-- (`resource_key`, `resource_tail`), against each interval's `resource_keys` (its node name
-- and its cloud provider id). Each row names its run and period within it.
-- Bills span every project, so in a distributed database these are reference tables.

CREATE TABLE bills (
    id           uuid PRIMARY KEY,
    content_hash bytea NOT NULL,
    rows         integer NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE bill_statements (
    id                   uuid PRIMARY KEY,
    provider             text NOT NULL,
    billing_account      text NOT NULL,
    billing_period_start timestamptz NOT NULL,
    bill_id              uuid NOT NULL REFERENCES bills (id),
    rows_hash            bytea NOT NULL,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    UNIQUE (provider, billing_account, billing_period_start)
);

CREATE TABLE bill_rows (
    statement_id    uuid NOT NULL REFERENCES bill_statements (id),
    line            bigint NOT NULL,
    charge_category text NOT NULL,
    charge_from     timestamptz NOT NULL,
    charge_until    timestamptz NOT NULL CHECK (charge_until >= charge_from),
    billed_cost     numeric NOT NULL,
    currency        char(3) NOT NULL,
    resource_id     text,
    run             integer,
    period          integer,
    service         text NOT NULL,
    sku             text NOT NULL,
    region          text,
    billing_mode    text NOT NULL CHECK (billing_mode IN ('on_demand', 'spot', 'reserved')),
    consumed_hours  numeric,
    instance_type   text,
    gpu_model       text,
    gpus            integer CHECK (gpus > 0),
    PRIMARY KEY (statement_id, line)
);
CREATE INDEX bill_rows_by_run ON bill_rows (statement_id, run, period) WHERE run IS NOT NULL;

CREATE TABLE bill_runs (
    statement_id    uuid NOT NULL REFERENCES bill_statements (id),
    run             integer NOT NULL,
    resource_key    text NOT NULL,
    resource_tail   text,
    currency        char(3) NOT NULL,
    charge_from     timestamptz NOT NULL,
    period_us       bigint NOT NULL CHECK (period_us > 0),
    periods         integer NOT NULL CHECK (periods > 0),
    cost_per_period numeric NOT NULL,
    charge_until    timestamptz NOT NULL,
    PRIMARY KEY (statement_id, run)
);
CREATE INDEX bill_runs_by_resource_key ON bill_runs (resource_key, charge_from);
CREATE INDEX bill_runs_by_resource_tail ON bill_runs (resource_tail, charge_from)
    WHERE resource_tail IS NOT NULL;

-- The keys a bill row may name a node's interval by, and the statement whose rows created
-- the interval (a GPU instance the bill shows and no collector reported).
ALTER TABLE capacity_intervals
    ADD COLUMN resource_keys text[] NOT NULL DEFAULT '{}',
    ADD COLUMN bill_statement uuid REFERENCES bill_statements (id);
CREATE INDEX capacity_intervals_by_resource_keys ON capacity_intervals USING gin (resource_keys);
CREATE INDEX capacity_intervals_by_bill_statement ON capacity_intervals (bill_statement)
    WHERE bill_statement IS NOT NULL;

UPDATE capacity_intervals c
SET resource_keys = k.keys
FROM (
    SELECT i.node, i.from_at,
           array_agg(DISTINCT key ORDER BY key) FILTER (WHERE key IS NOT NULL AND key <> '')
               AS keys
    FROM capacity_intervals i
    CROSS JOIN LATERAL (
        SELECT regexp_replace(lower(i.labels ->> 'provider_id'), '^([a-z0-9+.-]*://)?/*', '')
            AS full_id
    ) AS p
    CROSS JOIN LATERAL unnest(ARRAY[
        lower(i.node),
        p.full_id,
        CASE WHEN p.full_id LIKE '%/%' AND p.full_id !~ '/[0-9]+$'
             THEN regexp_replace(p.full_id, '^.*/', '') END,
        substring(p.full_id FROM '^(.*/virtualmachinescalesets/[^/]+)')
    ]) AS key
    GROUP BY i.node, i.from_at
) AS k
WHERE (c.node, c.from_at) = (k.node, k.from_at);
