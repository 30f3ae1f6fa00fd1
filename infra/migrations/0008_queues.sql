-- duetime schema, version 8: queues (issue 14, item 1).
--
-- jobs.queue: the queue whose workers run the job's executions (the definition's `queue`).
-- executions.queue: the queue an execution was emitted to (its request's `queue`): the figures
-- per queue (`GET /v1/stats/executions?queue=`) and an execution's view read it. A job moved to
-- another queue keeps its past executions under the queue they ran in.
-- Rows written before this version were all in the default queue, which is what the default
-- fills in: nothing to backfill.
ALTER TABLE jobs ADD COLUMN queue text NOT NULL DEFAULT 'default';
ALTER TABLE executions ADD COLUMN queue text NOT NULL DEFAULT 'default';
-- `GET /v1/jobs?queue=` pages newest first within one queue
CREATE INDEX jobs_queue ON jobs (queue, created_at DESC, job_id DESC);
