-- Model FLOPs utilisation: a record may say how many floating-point operations its model's
-- math needed and in which precision; the peak FLOPS of one of its GPUs (or MIG slices) at
-- that precision is kept beside them, as the catalogue had it when the record was stored, so
-- that a record's MFU does not move when the catalogue gains a figure.
ALTER TABLE job_records
    ADD COLUMN model_flops numeric CHECK (model_flops > 0),
    ADD COLUMN precision   text CHECK (precision IN ('fp8', 'bf16', 'fp16', 'tf32', 'fp32')),
    ADD COLUMN peak_flops  numeric CHECK (peak_flops > 0),
    ADD CONSTRAINT job_records_peak_with_flops CHECK (peak_flops IS NULL OR model_flops IS NOT NULL),
    ADD CONSTRAINT job_records_mfu_at_most_one
        CHECK (peak_flops IS NULL OR model_flops <= peak_flops * gpu_seconds_held);

-- The records that report their FLOPs, found by project and time when a period's MFU is read.
CREATE INDEX job_records_with_flops ON job_records (project_id, ended_at, started_at)
    WHERE peak_flops IS NOT NULL;
