-- Capacity figures kept in rollups, so that a month of a large fleet reads in milliseconds.
--
-- Two levels, both in GPU-seconds and free of prices (prices are applied when read):
--
-- `capacity_usage_hourly`: what the records that name nodes put on each node in each ledger
-- hour, by project: each segment's card-seconds spread evenly over its record's nodes.
-- Rating appends the signed change of every segment it stores or takes out as delta rows
-- (`delta` from `rollup_deltas`); compaction folds them into rows with `delta = 0`.
--
-- `capacity_node_days`: per node, ledger day and pool, the used GPU-seconds capped at each
-- hour's up time, what went beyond it (overbooked), and what each project put on the node in
-- the hours its capacity is known (the weights of `by_usage`); `capacity_unmatched_days`:
-- what records put on a node in hours no interval covers. They are rewritten, under the
-- node's advisory lock, by whoever changes a node's intervals or usage, in the same
-- transaction, and rebuilt when the ledger time zone changes.

-- The nodes a record was rated with, so that taking its segments out takes them off the
-- nodes they were put on, whatever the record says now.
ALTER TABLE rated_records ADD COLUMN nodes text[];
UPDATE rated_records d SET nodes = r.nodes
FROM job_records r
WHERE r.nodes IS NOT NULL
  AND (d.project_id, d.task_id, d.attempt) = (r.project_id, r.task_id, r.attempt);

CREATE TABLE capacity_usage_hourly (
    project_id  text NOT NULL,
    node        text NOT NULL,
    hour        timestamptz NOT NULL,
    gpu_seconds numeric NOT NULL,
    delta       bigint NOT NULL,
    PRIMARY KEY (project_id, node, hour, delta)
);
CREATE INDEX capacity_usage_hourly_by_node ON capacity_usage_hourly (node, hour);
CREATE INDEX capacity_usage_hourly_deltas ON capacity_usage_hourly (delta) WHERE delta <> 0;

INSERT INTO capacity_usage_hourly (project_id, node, hour, gpu_seconds, delta)
SELECT s.project_id, n.node, s.hour, sum(round(s.card_seconds / cardinality(d.nodes), 20)), 0
FROM rated_records d
CROSS JOIN LATERAL unnest(d.nodes) AS n(node)
JOIN rated_segments s
  ON (s.project_id, s.task_id, s.attempt) = (d.project_id, d.task_id, d.attempt)
WHERE d.nodes IS NOT NULL
GROUP BY s.project_id, n.node, s.hour
HAVING sum(round(s.card_seconds / cardinality(d.nodes), 20)) <> 0;

CREATE TABLE capacity_node_days (
    node           text NOT NULL,
    day            date NOT NULL,
    pool_id        text NOT NULL REFERENCES pools (id),
    used           numeric NOT NULL,
    overbooked     numeric NOT NULL,
    usage_projects text[] NOT NULL,
    usage_seconds  numeric[] NOT NULL,
    PRIMARY KEY (node, day, pool_id),
    CHECK (cardinality(usage_projects) = cardinality(usage_seconds))
);
CREATE INDEX capacity_node_days_by_day ON capacity_node_days (day, pool_id);

CREATE TABLE capacity_unmatched_days (
    node        text NOT NULL,
    day         date NOT NULL,
    gpu_seconds numeric NOT NULL,
    PRIMARY KEY (node, day)
);
CREATE INDEX capacity_unmatched_days_by_day ON capacity_unmatched_days (day);

-- The node-day rows summed per pool and ledger day, and their `by_usage` weights per pool,
-- ledger month and project: whoever rewrites node-day rows appends the difference as delta
-- rows (`delta` from `rollup_deltas`), which compaction folds into rows with `delta = 0`.
CREATE TABLE capacity_pool_days (
    pool_id    text NOT NULL,
    day        date NOT NULL,
    used       numeric NOT NULL,
    overbooked numeric NOT NULL,
    delta      bigint NOT NULL,
    PRIMARY KEY (pool_id, day, delta)
);
CREATE INDEX capacity_pool_days_deltas ON capacity_pool_days (delta) WHERE delta <> 0;

CREATE TABLE capacity_pool_weights (
    pool_id     text NOT NULL,
    month       date NOT NULL,
    project_id  text NOT NULL,
    gpu_seconds numeric NOT NULL,
    delta       bigint NOT NULL,
    PRIMARY KEY (pool_id, month, project_id, delta)
);
CREATE INDEX capacity_pool_weights_deltas ON capacity_pool_weights (delta) WHERE delta <> 0;
