-- duetime schema, version 4: deleted jobs (DELETE /v1/jobs/{id}).
--
-- A delete is published as a cancel command plus the next revision of the job's definition
-- carrying the reserved label `duetime.deleted` (users cannot set labels of the reserved
-- prefix). The column is derived from the labels the projector already writes (highest
-- revision wins), so it needs no event kind of its own and a projection rebuild, which replays
-- the jobs topic, gives it back exactly; the API's own read-your-writes row gets it the same way.
ALTER TABLE jobs ADD COLUMN deleted boolean
    GENERATED ALWAYS AS (labels ? 'duetime.deleted') STORED;

-- GET /v1/jobs lists the jobs that are not deleted, newest first.
CREATE INDEX jobs_live_created ON jobs (created_at DESC, job_id DESC) WHERE NOT deleted;
