-- duetime schema, version 3: what the projector and the REST API need beyond version 1.

-- The offset (in its state-topic partition) of the scheduler state the job's status came from.
-- The state topic is the scheduler's authoritative changelog and all states of a job sit in one
-- partition, so a higher offset is always newer: the status never moves backwards, whatever
-- the order in which topics are read. -1: no state seen yet (status from the definition or
-- from the API's own read-your-writes row).
ALTER TABLE jobs ADD COLUMN state_offset bigint NOT NULL DEFAULT -1;

-- Listing filters of GET /v1/jobs, newest first.
CREATE INDEX jobs_priority ON jobs (priority, created_at DESC, job_id DESC);
CREATE INDEX jobs_name_created ON jobs (name, created_at DESC, job_id DESC);

-- A DAG run's per-job status comes from its executions.
CREATE INDEX executions_dag_run ON executions (dag_run_id) WHERE dag_run_id IS NOT NULL;

CREATE INDEX dead_letters_job ON dead_letters (job_id, dead_at DESC);

-- Replays of dead executions, projected from the control topic's replay commands. Kept apart
-- from dead_letters so the projection does not depend on which of the two topics is read
-- first (a rebuild reads them in another order than the live run did).
CREATE TABLE dlq_replays (
    execution_id  uuid PRIMARY KEY,
    replayed_at   timestamptz NOT NULL
);
