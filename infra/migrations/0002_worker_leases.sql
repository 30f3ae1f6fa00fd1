-- duetime schema, version 2: what the worker role needs from the execution leases.
--
-- result: the ExecutionResult (Avro frame) a worker recorded when it completed the lease. The
-- lease is completed (fenced by its token) BEFORE the result is published, so a worker that
-- dies in between leaves a finished lease whose result nobody published: the worker that
-- gets the redelivered request republishes this value instead of running the job again.
ALTER TABLE leases ADD COLUMN result bytea;
ALTER TABLE leases ADD COLUMN claimed_at timestamptz;

-- Renewals and completions rewrite every row a few times: leave room for HOT updates.
ALTER TABLE leases SET (fillfactor = 80);

-- The janitor deletes finished leases after the execution topics' retention (7 days).
CREATE INDEX leases_done_at ON leases (updated_at) WHERE state = 'done';
