-- Idle-GPU alerts: a stored record that held GPUs for at least a project's minimum while its
-- SM activity (or, without it, its reported busy share) stayed under the project's threshold
-- fires one `idle_gpu` alert per task, through the same outbox as budget alerts.

-- Per project: the threshold (a share from 0 to 1; null turns idle-GPU alerts off) and the
-- least GPU-hours a record must hold to be judged at all.
ALTER TABLE projects
    ADD COLUMN idle_gpu_threshold     numeric DEFAULT 0.05
        CHECK (idle_gpu_threshold > 0 AND idle_gpu_threshold <= 1),
    ADD COLUMN idle_gpu_min_gpu_hours numeric NOT NULL DEFAULT 1
        CHECK (idle_gpu_min_gpu_hours > 0);

-- An alert event is now a budget alert (`actual`, `forecast`: threshold, spend, budget,
-- burn) or an idle-GPU alert (`idle_gpu`: the record it judged, how idle it was, what it
-- cost). `month` is, for an idle alert, the ledger month holding the record's end.
ALTER TABLE alert_events
    DROP CONSTRAINT alert_events_kind_check,
    ADD CONSTRAINT alert_events_kind_check CHECK (kind IN ('actual', 'forecast', 'idle_gpu')),
    ALTER COLUMN threshold DROP NOT NULL,
    ALTER COLUMN spend DROP NOT NULL,
    ALTER COLUMN budget DROP NOT NULL,
    ALTER COLUMN burn_pct DROP NOT NULL,
    ADD COLUMN task_id          text,
    ADD COLUMN attempt          integer,
    ADD COLUMN gpu_model        text,
    ADD COLUMN gpu_count        numeric,
    ADD COLUMN mig_profile      text,
    ADD COLUMN gpu_seconds_held numeric,
    ADD COLUMN idle_measure     text CHECK (idle_measure IN ('sm_active', 'busy_share')),
    ADD COLUMN idle_value       numeric,
    ADD COLUMN idle_threshold   numeric,
    ADD COLUMN min_gpu_hours    numeric,
    ADD COLUMN cost             numeric,
    ADD CONSTRAINT alert_events_budget_fields CHECK (
        kind = 'idle_gpu'
        OR (threshold IS NOT NULL AND spend IS NOT NULL AND budget IS NOT NULL
            AND burn_pct IS NOT NULL AND task_id IS NULL)),
    ADD CONSTRAINT alert_events_idle_gpu_fields CHECK (
        kind <> 'idle_gpu'
        OR (threshold IS NULL AND task_id IS NOT NULL AND attempt IS NOT NULL
            AND gpu_model IS NOT NULL AND gpu_count IS NOT NULL
            AND gpu_seconds_held IS NOT NULL AND idle_measure IS NOT NULL
            AND idle_value IS NOT NULL AND idle_threshold IS NOT NULL
            AND min_gpu_hours IS NOT NULL AND cost IS NOT NULL));

-- Once per task, whichever attempt was idle first; `alert_events_once` keeps budget alerts
-- once per (project, month, threshold, kind), and never matches an idle alert, whose
-- threshold is null.
CREATE UNIQUE INDEX alert_events_idle_gpu_once ON alert_events (project_id, task_id)
    WHERE kind = 'idle_gpu';
