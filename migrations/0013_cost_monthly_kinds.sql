-- Every project's monthly cost summed by only what a figure tells apart: whether segments
-- completed, the reason and model of unrated ones, and the output unit of completed ones.
-- The monthly report reads every project's month; grouping their monthly rows (by model,
-- mode, outcome, contract, reason and unit) into these took most of its database time.
-- Compaction keeps this table: the delta rows it folds into `cost_monthly` are added here in
-- the same statement, so this table plus the monthly delta rows not folded yet always sums
-- to `cost_monthly`.
CREATE TABLE cost_monthly_kinds (
    project_id       text NOT NULL,
    month            date NOT NULL CHECK (extract(day FROM month) = 1),
    completed        boolean NOT NULL,
    unrated_reason   text,
    -- Set for unrated segments only.
    gpu_model        text,
    -- Set for completed segments only.
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
    CONSTRAINT cost_monthly_kinds_key UNIQUE NULLS NOT DISTINCT
        (month, project_id, completed, unrated_reason, gpu_model, output_unit)
);

INSERT INTO cost_monthly_kinds
SELECT project_id, month, outcome = 'completed', unrated_reason,
       CASE WHEN unrated_reason IS NOT NULL THEN gpu_model END,
       CASE WHEN outcome = 'completed' THEN output_unit END,
       sum(segments), sum(gpu_seconds_held), sum(gpu_seconds_busy), sum(cost), sum(productive),
       sum(idle), sum(unmeasured), sum(failed), sum(output_quantity)
FROM cost_monthly
WHERE delta = 0
GROUP BY 1, 2, 3, 4, 5, 6
HAVING sum(segments) <> 0;
