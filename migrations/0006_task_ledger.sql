-- What each task cost: per-task sums per ledger day and ledger month, and each task's
-- status on its lock row in `tasks`.
--
-- Unlike the project rollups, these rows are updated in place: every writer of a task holds
-- that task's row in `tasks` (see 0005), so two transactions never change the same task's
-- rows at once, and the signed difference of a re-rating is added straight to them. A row
-- under which no segment and no record is left is deleted, so lists never show it.
--
-- A task's lifetime figures are the sum of its monthly rows (a task spans few months), so
-- writers keep no third copy. Writers need no index by task: they delete the rows they
-- empty by the row ids their upserts return.

-- Queue wait of the attempt (`started_at − queued_at`), null when it reported no `queued_at`.
ALTER TABLE rated_records ADD COLUMN queue_wait_seconds numeric;
UPDATE rated_records d
SET queue_wait_seconds = extract(epoch FROM r.started_at - r.queued_at)
FROM job_records r
WHERE (r.project_id, r.task_id, r.attempt) = (d.project_id, d.task_id, d.attempt)
  AND r.queued_at IS NOT NULL;

-- Every row a task's figures of a ledger hour are summed from: its segments by their hour
-- (the parts, GPU-seconds and output of completed records, unit → quantity), and its attempts
-- by the hour holding their end (the per-record counts).
CREATE VIEW task_hourly AS
SELECT project_id, task_id, hour,
       1 AS segments, coalesce(cost, 0) AS cost, productive, idle, unmeasured, failed,
       gpu_seconds_held, coalesce(gpu_seconds_busy, 0) AS gpu_seconds_busy,
       CASE WHEN unrated_reason IS NULL THEN 0 ELSE gpu_seconds_held END AS unrated_gpu_seconds,
       CASE WHEN output_quantity IS NULL THEN '{}'::jsonb
            ELSE jsonb_build_object(output_unit, output_quantity) END AS output,
       0 AS attempts, 0 AS failed_attempts, 0 AS retries, 0 AS failures,
       0 AS queue_wait_seconds, 0 AS queue_waits
FROM rated_segments
UNION ALL
SELECT project_id, task_id, end_hour,
       0, 0, 0, 0, 0, 0, 0, 0, 0, '{}'::jsonb,
       1, (outcome <> 'completed')::int, retries, failures,
       coalesce(queue_wait_seconds, 0), (queue_wait_seconds IS NOT NULL)::int
FROM rated_records;

-- Adds two maps of unit → quantity, leaving out units whose quantity becomes zero.
CREATE FUNCTION add_quantities(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(jsonb_object_agg(unit, quantity), '{}'::jsonb)
    FROM (SELECT unit, sum(quantity::numeric) AS quantity
          FROM (SELECT * FROM jsonb_each_text(a) UNION ALL SELECT * FROM jsonb_each_text(b))
               AS e(unit, quantity)
          GROUP BY unit) AS sums
    WHERE quantity <> 0
$$;

-- Sums of `add_quantities` over rows.
CREATE AGGREGATE sum_quantities(jsonb) (
    SFUNC = add_quantities,
    STYPE = jsonb,
    INITCOND = '{}'
);

CREATE TABLE task_daily (
    project_id          text NOT NULL,
    task_id             text NOT NULL,
    day                 date NOT NULL,
    -- How many segments of the task lie in the day: with `attempts`, zero exactly when
    -- nothing is left under the row.
    segments            bigint NOT NULL DEFAULT 0,
    cost                numeric NOT NULL DEFAULT 0,
    productive          numeric NOT NULL DEFAULT 0,
    idle                numeric NOT NULL DEFAULT 0,
    unmeasured          numeric NOT NULL DEFAULT 0,
    failed              numeric NOT NULL DEFAULT 0,
    gpu_seconds_held    numeric NOT NULL DEFAULT 0,
    gpu_seconds_busy    numeric NOT NULL DEFAULT 0,
    unrated_gpu_seconds numeric NOT NULL DEFAULT 0,
    output              jsonb NOT NULL DEFAULT '{}',
    attempts            bigint NOT NULL DEFAULT 0,
    failed_attempts     bigint NOT NULL DEFAULT 0,
    retries             bigint NOT NULL DEFAULT 0,
    failures            bigint NOT NULL DEFAULT 0,
    queue_wait_seconds  numeric NOT NULL DEFAULT 0,
    -- Attempts that reported `queued_at`, over which `queue_wait_seconds` is summed.
    queue_waits         bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, day, task_id)
);

CREATE TABLE task_monthly (
    project_id          text NOT NULL,
    task_id             text NOT NULL,
    month               date NOT NULL CHECK (extract(day FROM month) = 1),
    segments            bigint NOT NULL DEFAULT 0,
    cost                numeric NOT NULL DEFAULT 0,
    productive          numeric NOT NULL DEFAULT 0,
    idle                numeric NOT NULL DEFAULT 0,
    unmeasured          numeric NOT NULL DEFAULT 0,
    failed              numeric NOT NULL DEFAULT 0,
    gpu_seconds_held    numeric NOT NULL DEFAULT 0,
    gpu_seconds_busy    numeric NOT NULL DEFAULT 0,
    unrated_gpu_seconds numeric NOT NULL DEFAULT 0,
    output              jsonb NOT NULL DEFAULT '{}',
    attempts            bigint NOT NULL DEFAULT 0,
    failed_attempts     bigint NOT NULL DEFAULT 0,
    retries             bigint NOT NULL DEFAULT 0,
    failures            bigint NOT NULL DEFAULT 0,
    queue_wait_seconds  numeric NOT NULL DEFAULT 0,
    queue_waits         bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (project_id, month, task_id)
);
-- A project's tasks of a month, most expensive first, paged by (cost, task_id).
CREATE INDEX task_monthly_by_cost ON task_monthly (project_id, month, cost DESC, task_id);

INSERT INTO task_daily
SELECT project_id, task_id, (hour AT TIME ZONE tz.name)::date,
       sum(segments), sum(cost), sum(productive), sum(idle), sum(unmeasured), sum(failed),
       sum(gpu_seconds_held), sum(gpu_seconds_busy), sum(unrated_gpu_seconds),
       sum_quantities(output), sum(attempts), sum(failed_attempts), sum(retries),
       sum(failures), sum(queue_wait_seconds), sum(queue_waits)
FROM task_hourly,
     (SELECT coalesce((SELECT value FROM settings WHERE key = 'rollup_timezone'), 'UTC')
      AS name) AS tz
GROUP BY 1, 2, 3;

INSERT INTO task_monthly
SELECT project_id, task_id, date_trunc('month', day)::date,
       sum(segments), sum(cost), sum(productive), sum(idle), sum(unmeasured), sum(failed),
       sum(gpu_seconds_held), sum(gpu_seconds_busy), sum(unrated_gpu_seconds),
       sum_quantities(output), sum(attempts), sum(failed_attempts), sum(retries),
       sum(failures), sum(queue_wait_seconds), sum(queue_waits)
FROM task_daily
GROUP BY 1, 2, 3;

-- A task's status: `completed` once any attempt completed, else the outcome of its latest
-- attempt by `started_at`; null while it has no attempt. `completed_at` is the end of its
-- first completed attempt.
-- Every rating call updates the rows of the tasks it rated; room left in each page keeps
-- those updates off the primary key.
ALTER TABLE tasks SET (fillfactor = 50);
ALTER TABLE tasks
    ADD COLUMN status text
        CHECK (status IN ('completed', 'failed', 'cancelled', 'preempted')),
    ADD COLUMN completed_at timestamptz,
    ADD COLUMN first_started_at timestamptz,
    ADD COLUMN last_ended_at timestamptz,
    ADD COLUMN gpu_models text[] NOT NULL DEFAULT '{}';

UPDATE tasks t
SET status = CASE WHEN s.completed_at IS NULL THEN s.latest_outcome ELSE 'completed' END,
    completed_at = s.completed_at,
    first_started_at = s.first_started_at,
    last_ended_at = s.last_ended_at,
    gpu_models = s.gpu_models
FROM (
    SELECT r.project_id, r.task_id,
           min(r.ended_at) FILTER (WHERE d.completes_task) AS completed_at,
           min(r.started_at) AS first_started_at, max(r.ended_at) AS last_ended_at,
           array_agg(DISTINCT r.gpu_model ORDER BY r.gpu_model) AS gpu_models,
           (array_agg(r.outcome ORDER BY r.started_at DESC, r.attempt DESC))[1]
               AS latest_outcome
    FROM job_records r
    JOIN rated_records d USING (project_id, task_id, attempt)
    GROUP BY r.project_id, r.task_id
) AS s
WHERE (t.project_id, t.task_id) = (s.project_id, s.task_id);
