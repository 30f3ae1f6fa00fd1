-- duetime schema, version 10: named calendars and backfills (issue 18, item 5).
--
-- calendars: the named calendars of /v1/calendars, kept by the API alone. A job does not
-- point at a row: the API copies the calendar's rules into the job's definition when the job
-- is created or updated (docs/decisions.md), so the schedulers never read this table and a
-- calendar change or delete does not reach an existing job until it is updated.
CREATE TABLE calendars (
    name        text PRIMARY KEY,
    rules       jsonb NOT NULL,            -- the API form: name, timezone, exclude, exclude_weekdays
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- backfills: what POST /v1/jobs/{id}/backfill asked for, so that GET can list a job's
-- backfills and their progress. The progress itself is not stored: it is counted from the
-- executions of the backfill's ids (derived from the id and each occurrence), which the
-- projector writes as the workers run them. backfill_id derives from (job_id, from, to):
-- asking twice for a range finds the same row.
CREATE TABLE backfills (
    backfill_id   uuid PRIMARY KEY,
    job_id        uuid NOT NULL,
    range_from    timestamptz NOT NULL,
    range_to      timestamptz NOT NULL,
    occurrences   integer NOT NULL,        -- runs the range holds (calendar-excluded ones left out)
    excluded      integer NOT NULL,        -- occurrences the job's calendar excluded
    requested_at  timestamptz NOT NULL,
    requested_by  text
);
CREATE INDEX backfills_job ON backfills (job_id, requested_at DESC);
