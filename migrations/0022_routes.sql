-- Routes: budgets and retry caps on one label value of a project's records (say label `route`,
-- value `summarise`). A route's monthly budget fires the project's thresholds for the spend of
-- the records carrying the label; `max_attempts_per_task` and `max_failed_spend_per_hour`
-- fire `retry_storm` alerts. Every key leads with the project.

CREATE TABLE routes (
    project_id                text NOT NULL REFERENCES projects (id),
    label_key                 text NOT NULL,
    label_value               text NOT NULL,
    monthly_budget            numeric CHECK (monthly_budget > 0),
    max_attempts_per_task     integer CHECK (max_attempts_per_task > 0),
    max_failed_spend_per_hour numeric CHECK (max_failed_spend_per_hour > 0),
    created_at                timestamptz NOT NULL DEFAULT now(),
    updated_at                timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, label_key, label_value),
    CONSTRAINT routes_something_set CHECK (
        monthly_budget IS NOT NULL OR max_attempts_per_task IS NOT NULL
        OR max_failed_spend_per_hour IS NOT NULL)
);

-- Alerts may carry the route they are about: a route's budget alerts (`actual`,
-- `forecast`) and `retry_storm` alerts, which name either the task whose attempt went beyond
-- the cap (`task_id`, `attempt`) or the ledger hour whose failed spend did (`storm_hour`),
-- with the cap and what was observed.
ALTER TABLE alert_events
    DROP CONSTRAINT alert_events_kind_check,
    ADD CONSTRAINT alert_events_kind_check
        CHECK (kind IN ('actual', 'forecast', 'idle_gpu', 'zombie_capacity', 'retry_storm')),
    DROP CONSTRAINT alert_events_budget_fields,
    ADD CONSTRAINT alert_events_budget_fields CHECK (
        kind IN ('idle_gpu', 'zombie_capacity', 'retry_storm')
        OR (threshold IS NOT NULL AND spend IS NOT NULL AND budget IS NOT NULL
            AND burn_pct IS NOT NULL AND task_id IS NULL)),
    ADD COLUMN route_key   text,
    ADD COLUMN route_value text,
    ADD COLUMN storm_hour  timestamptz,
    ADD COLUMN cap         numeric,
    ADD COLUMN observed    numeric,
    ADD CONSTRAINT alert_events_route CHECK ((route_key IS NULL) = (route_value IS NULL)),
    ADD CONSTRAINT alert_events_retry_storm_fields CHECK (
        kind <> 'retry_storm'
        OR (threshold IS NULL AND route_key IS NOT NULL AND cap IS NOT NULL
            AND observed IS NOT NULL
            AND ((task_id IS NOT NULL AND attempt IS NOT NULL AND storm_hour IS NULL)
                 OR (task_id IS NULL AND storm_hour IS NOT NULL)))),
    DROP CONSTRAINT alert_events_once;

-- A project's budget alerts: once per (project, month, threshold, kind), as before.
CREATE UNIQUE INDEX alert_events_once ON alert_events (project_id, month, threshold, kind)
    WHERE route_key IS NULL;
-- A route's budget alerts: once per (project, route, month, threshold, kind).
CREATE UNIQUE INDEX alert_events_route_budget_once
    ON alert_events (project_id, route_key, route_value, month, threshold, kind)
    WHERE kind IN ('actual', 'forecast') AND route_key IS NOT NULL;
-- Retry storms: once per (project, route, task), whichever attempt crossed the cap first, and
-- once per (project, route, ledger hour).
CREATE UNIQUE INDEX alert_events_retry_storm_task_once
    ON alert_events (project_id, route_key, route_value, task_id)
    WHERE kind = 'retry_storm' AND task_id IS NOT NULL;
CREATE UNIQUE INDEX alert_events_retry_storm_hour_once
    ON alert_events (project_id, route_key, route_value, storm_hour)
    WHERE kind = 'retry_storm' AND storm_hour IS NOT NULL;
