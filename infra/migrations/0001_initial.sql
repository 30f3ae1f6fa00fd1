-- duetime schema, version 1: the queryable projection, the execution leases and the
-- projector's offsets. Kafka is the source of truth; everything here but the leases can be
-- rebuilt by replaying the topics (duetime projector --rebuild).

CREATE TABLE jobs (
    job_id            uuid PRIMARY KEY,
    name              text        NOT NULL,
    status            text        NOT NULL,
    priority          text        NOT NULL,
    schedule          jsonb,
    target            jsonb       NOT NULL,
    payload           jsonb,
    retry             jsonb       NOT NULL,
    timeout_s         double precision NOT NULL,
    misfire           text        NOT NULL,
    overlap           text        NOT NULL,
    dag_id            uuid,
    dag_key           text,
    depends_on        text[]      NOT NULL DEFAULT '{}',
    labels            jsonb       NOT NULL DEFAULT '{}',
    revision          bigint      NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    next_run_at       timestamptz,
    last_execution_id uuid,
    -- status rank of the last applied event, so an older event never moves status backwards
    status_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_created ON jobs (created_at DESC, job_id DESC);
CREATE INDEX jobs_status ON jobs (status, created_at DESC);
CREATE INDEX jobs_name ON jobs (name);
CREATE INDEX jobs_dag ON jobs (dag_id) WHERE dag_id IS NOT NULL;

-- One row per execution (an occurrence of a job); its attempts are in `attempts`.
-- Partitioned by day on scheduled_at, so dropping a day of history is O(1).
CREATE TABLE executions (
    execution_id  uuid        NOT NULL,
    scheduled_at  timestamptz NOT NULL,
    job_id        uuid        NOT NULL,
    name          text        NOT NULL DEFAULT '',
    priority      text        NOT NULL,
    status        text        NOT NULL,
    attempt       integer     NOT NULL,
    trigger       text,
    queued_at     timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz,
    worker_id     text,
    error         jsonb,
    attempts      jsonb       NOT NULL DEFAULT '[]',
    lateness_ms   double precision,
    dag_id        uuid,
    dag_run_id    text,
    PRIMARY KEY (scheduled_at, execution_id)
) PARTITION BY RANGE (scheduled_at);
CREATE INDEX executions_job ON executions (job_id, scheduled_at DESC);
CREATE INDEX executions_id ON executions (execution_id);
CREATE TABLE executions_default PARTITION OF executions DEFAULT;

-- Creates the daily partitions [day, day + days) that do not exist yet.
CREATE FUNCTION duetime_ensure_execution_partitions(first_day date, days integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    d date;
    made integer := 0;
    part text;
BEGIN
    FOR i IN 0 .. days - 1 LOOP
        d := first_day + i;
        part := format('executions_%s', to_char(d, 'YYYYMMDD'));
        IF to_regclass(part) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE %I PARTITION OF executions FOR VALUES FROM (%L) TO (%L)',
                part, d::timestamptz AT TIME ZONE 'UTC', (d + 1)::timestamptz AT TIME ZONE 'UTC');
            made := made + 1;
        END IF;
    END LOOP;
    RETURN made;
END $$;

CREATE TABLE dags (
    dag_id      uuid PRIMARY KEY,
    name        text        NOT NULL,
    schedule    jsonb,
    overlap     text        NOT NULL,
    nodes       jsonb       NOT NULL,
    revision    bigint      NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

CREATE TABLE dag_runs (
    dag_run_id     text PRIMARY KEY,
    dag_id         uuid        NOT NULL,
    status         text        NOT NULL,
    started_at     timestamptz NOT NULL,
    finished_at    timestamptz,
    node_statuses  jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX dag_runs_dag ON dag_runs (dag_id, started_at DESC);

CREATE TABLE dead_letters (
    execution_id  uuid PRIMARY KEY,
    job_id        uuid        NOT NULL,
    name          text        NOT NULL,
    dead_at       timestamptz NOT NULL,
    attempts      integer     NOT NULL,
    errors        jsonb       NOT NULL,
    request       jsonb       NOT NULL,
    dag_run_id    text,
    replayed_at   timestamptz
);
CREATE INDEX dead_letters_dead_at ON dead_letters (dead_at DESC, execution_id DESC);

-- Execution leases: at most one live attempt per execution. fencing_token grows with every
-- claim (from one sequence), so a stale holder is recognisable wherever it writes.
CREATE SEQUENCE lease_fencing_tokens;
CREATE TABLE leases (
    execution_id   uuid PRIMARY KEY,
    attempt        integer     NOT NULL,
    owner          text        NOT NULL,
    fencing_token  bigint      NOT NULL,
    expires_at     timestamptz NOT NULL,
    state          text        NOT NULL DEFAULT 'held',  -- held | done
    outcome        text,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT leases_state CHECK (state IN ('held', 'done'))
);
CREATE INDEX leases_expiry ON leases (expires_at) WHERE state = 'held';

-- The projector's consumed offsets, written in the same transaction as the rows they produced.
CREATE TABLE projector_offsets (
    consumer     text    NOT NULL,
    topic        text    NOT NULL,
    partition    integer NOT NULL,
    next_offset  bigint  NOT NULL,
    PRIMARY KEY (consumer, topic, partition)
);
