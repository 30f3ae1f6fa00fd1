-- duetime schema, version 6: a job's start window (issue 14, item 4).
--
-- start_within_s: how long after its due time an execution of the job may still start
-- (seconds; NULL: no limit). Past it a worker reports the execution `expired` instead of
-- running it. The statuses are text columns without a CHECK constraint, so the new status
-- `expired` (jobs.status, executions.status) needs nothing here. Rows written before this
-- version have NULL: the projector fills it from the next definition it applies, and
-- `duetime projector --rebuild` fills every row.
ALTER TABLE jobs ADD COLUMN start_within_s double precision;
