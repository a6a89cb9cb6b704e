-- Queue wait is read from the job records that start in a period. With `queued_at` in the
-- index by start, that read is an index-only scan over the project's entries of the period,
-- instead of a fetch of every such record from wherever it lies in the table.
DROP INDEX job_records_by_start;
CREATE INDEX job_records_by_start ON job_records (project_id, started_at, task_id, attempt)
    INCLUDE (queued_at);
