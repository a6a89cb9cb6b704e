-- A task's figures are kept per ledger month only. Keeping them per ledger day too cost
-- every rating call a second upsert of each task it rated; a period that is not whole
-- months reads its whole months from `task_monthly` and its other hours from the view
-- `task_hourly`, so listing a month's tasks still reads no segment.
DROP TABLE task_daily;
