-- Efficiency regressions: a level shift of a workload's daily direct cost per unit fires one
-- `efficiency_regression` alert, and none again until the workload comes back under the
-- threshold. Every key leads with the project.

-- A project's rule; a project without a row is judged by the defaults (25 %, 10 a day, a
-- window of 3 days against 14, 5 completed records).
CREATE TABLE efficiency_regression_rules (
    project_id     text PRIMARY KEY REFERENCES projects (id),
    enabled        boolean NOT NULL,
    threshold      numeric NOT NULL CHECK (threshold > 0 AND threshold <= 100),
    min_extra_cost numeric NOT NULL CHECK (min_extra_cost >= 0),
    window_days    integer NOT NULL CHECK (window_days BETWEEN 1 AND 92),
    baseline_days  integer NOT NULL CHECK (baseline_days BETWEEN 1 AND 92),
    min_records    integer NOT NULL CHECK (min_records BETWEEN 1 AND 1000000),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- Whether a workload's cost per unit in a unit is regressed now. A row appears when a
-- workload first regresses; `regressed` turns false when it recovers, which re-arms it. The
-- transition to regressed is an upsert that changes the row only when it was not regressed,
-- so of two judges racing, one fires and the other finds it done.
CREATE TABLE efficiency_regression_states (
    project_id             text NOT NULL REFERENCES projects (id),
    workload               text NOT NULL,
    output_unit            text NOT NULL,
    regressed              boolean NOT NULL,
    -- The first day of the window whose level shift fired.
    since                  date NOT NULL,
    -- The ledger day after the window that last changed the row.
    judged_on              date NOT NULL,
    recovered_on           date,
    baseline_cost_per_unit numeric NOT NULL,
    window_cost_per_unit   numeric NOT NULL,
    PRIMARY KEY (project_id, workload, output_unit)
);

-- The alert names the workload and unit, `since` is the first instant of the window, and
-- `regression` holds the medians, the change, the extra cost a day, the rule and the three
-- factors, as decimal strings.
ALTER TABLE alert_events
    DROP CONSTRAINT alert_events_kind_check,
    ADD CONSTRAINT alert_events_kind_check
        CHECK (kind IN ('actual', 'forecast', 'idle_gpu', 'zombie_capacity', 'retry_storm',
                        'efficiency_regression')),
    DROP CONSTRAINT alert_events_budget_fields,
    ADD CONSTRAINT alert_events_budget_fields CHECK (
        kind IN ('idle_gpu', 'zombie_capacity', 'retry_storm', 'efficiency_regression')
        OR (threshold IS NOT NULL AND spend IS NOT NULL AND budget IS NOT NULL
            AND burn_pct IS NOT NULL AND task_id IS NULL)),
    ADD COLUMN workload    text,
    ADD COLUMN output_unit text,
    ADD COLUMN regression  jsonb,
    ADD CONSTRAINT alert_events_regression_fields CHECK (
        kind <> 'efficiency_regression'
        OR (threshold IS NULL AND workload IS NOT NULL AND output_unit IS NOT NULL
            AND since IS NOT NULL AND regression IS NOT NULL));

CREATE UNIQUE INDEX alert_events_regression_once
    ON alert_events (project_id, workload, output_unit, since)
    WHERE kind = 'efficiency_regression';
