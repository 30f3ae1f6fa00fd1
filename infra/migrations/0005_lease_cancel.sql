-- duetime schema, version 5: cancelling a running execution through its lease (issue 14.3).
--
-- job_id, dag_run_id: whose execution the lease is, written by the worker's claim, so that a
-- cancel (the API's, for a job or a DAG run) can find the live leases without reading Kafka.
-- Rows claimed before this version have NULL here and cannot be cancelled while running.
--
-- cancel_requested_at: set by consumers.worker.cancel.request_cancel; the holder reads it on
-- every renewal (every min(TTL/3, 2 s)) and stops the work. It is never cleared: a
-- redelivered request of the same execution that takes the lease over is cancelled too.
ALTER TABLE leases ADD COLUMN job_id text;
ALTER TABLE leases ADD COLUMN dag_run_id text;
ALTER TABLE leases ADD COLUMN cancel_requested_at timestamptz;

-- A cancel marks the live leases of one job (or DAG run): only held rows matter.
CREATE INDEX leases_held_job ON leases (job_id) WHERE state = 'held';
CREATE INDEX leases_held_dag_run ON leases (dag_run_id) WHERE state = 'held' AND dag_run_id IS NOT NULL;
