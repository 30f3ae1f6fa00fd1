-- duetime schema, version 9: concurrency and rate limits per key (issue 18, items 1 and 2).
--
-- jobs.concurrency, jobs.rate_limit: the definition's limits as the API shows them
-- ({"key", "limit"}, {"key", "per_s", "burst"}; NULL: none), so that an update (built from the
-- row) keeps them. Rows written before this version have NULL: they had no limits.
ALTER TABLE jobs ADD COLUMN concurrency jsonb;
ALTER TABLE jobs ADD COLUMN rate_limit jsonb;

-- leases.concurrency_key: the resolved concurrency key of the execution holding the lease
-- (NULL: the job has no concurrency limit). The live leases of a key are its taken slots: a
-- slot frees when its lease is completed ('done'), released (expires_at = now()) or expires
-- (a crashed worker's). Only duetime_claim_limited below writes it.
ALTER TABLE leases ADD COLUMN concurrency_key text;
CREATE INDEX leases_held_concurrency_key ON leases (concurrency_key)
    WHERE state = 'held' AND concurrency_key IS NOT NULL;

-- One token bucket per rate key, shared by every worker. tokens: what the bucket held at
-- refilled_at; full_at: when it will be full again (the janitor deletes buckets past it: a
-- missing bucket is a full one, so deleting it changes nothing).
CREATE TABLE rate_buckets (
    key text PRIMARY KEY,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL,
    full_at timestamptz NOT NULL
);
CREATE INDEX rate_buckets_full_at ON rate_buckets (full_at);

-- The claim of a batch of leases whose executions carry limits, in one transaction (one
-- round trip). Per execution, in the batch's order:
--   1. the lease row must be claimable exactly as in the plain claim (no row, an older
--      attempt, or this attempt's expired lease); if not, nothing is returned for it and the
--      caller inspects the row (busy, done, stale) as it does for a plain claim;
--   2. concurrency: a held lease of the key past its expiry gives its slot up and is fenced
--      out (new token: its holder's renewal and completion fail); if the live leases of the
--      key number `limit` or more, the answer is waiting = 'concurrency';
--   3. rate: the bucket refills (min(burst, tokens + elapsed * per_s)); without one whole
--      token the answer is waiting = 'rate' with the seconds until the next token
--      (duetime.core.keys.take_token is the same arithmetic);
--   4. the lease is inserted or taken over with the key, as the plain claim does, and the
--      token is spent.
-- Every key of the batch is locked first (transaction advisory locks, in one global order:
-- two batches cannot deadlock), so two workers never both see the same free slot; each
-- statement after the locks sees what the previous holders committed (READ COMMITTED takes
-- a snapshot per statement). A key's live leases and its bucket are read once per batch
-- (the first execution of the key) and counted in the function from there on, the buckets
-- written back once at the end: a batch holds many executions of few keys. Bucket times use
-- clock_timestamp() after the locks, so a key's refills never go back in time.
CREATE FUNCTION duetime_claim_limited(
    p_owner text, p_ttl_s double precision,
    p_ids uuid[], p_attempts int[], p_jobs text[], p_runs text[],
    p_ckeys text[], p_climits int[], p_rkeys text[], p_rates double precision[], p_bursts int[]
) RETURNS TABLE (execution_id text, token bigint, cancelled boolean, waiting text,
                 retry_in_s double precision)
LANGUAGE plpgsql AS $$
DECLARE
    i int;
    lock_key bigint;
    cpos int;
    rpos int;
    blocked uuid[];
    admitted int[] := '{}';
    -- per key, read once for the batch (a batch holds many executions of few keys), then
    -- counted here; the buckets are written back once at the end
    c_keys text[];
    c_live int[];
    r_keys text[];
    r_tokens double precision[];
    r_rates double precision[];
    r_bursts int[];
    r_at timestamptz;
BEGIN
    FOR lock_key IN
        SELECT DISTINCT h FROM (
            SELECT hashtextextended('c:' || k, 0) AS h FROM unnest(p_ckeys) AS k WHERE k IS NOT NULL
            UNION ALL
            SELECT hashtextextended('r:' || k, 0) FROM unnest(p_rkeys) AS k WHERE k IS NOT NULL
        ) AS keys ORDER BY h
    LOOP
        PERFORM pg_advisory_xact_lock(lock_key);
    END LOOP;
    r_at := clock_timestamp();  -- after the locks: a key's refills never go back in time
    -- 1. leases not claimable as in the plain claim (held, done, or a newer attempt)
    SELECT coalesce(array_agg(t.e), '{}') INTO blocked
    FROM unnest(p_ids, p_attempts) AS t(e, a) JOIN leases AS l ON l.execution_id = t.e
    WHERE NOT (l.attempt < t.a
               OR (l.attempt = t.a AND l.state = 'held' AND l.expires_at < now()));
    -- 2. the keys' slots: expired holders give theirs up (fenced out by a new token)
    UPDATE leases AS l
    SET fencing_token = nextval('lease_fencing_tokens'), concurrency_key = NULL,
        updated_at = now()
    WHERE l.concurrency_key = ANY(p_ckeys) AND l.state = 'held' AND l.expires_at < now();
    SELECT coalesce(array_agg(d.k), '{}'), coalesce(array_agg(
               (SELECT count(*)::int FROM leases AS l
                WHERE l.concurrency_key = d.k AND l.state = 'held')), '{}')
    INTO c_keys, c_live
    FROM (SELECT DISTINCT k FROM unnest(p_ckeys) AS k WHERE k IS NOT NULL) AS d;
    -- 3. the keys' buckets, refilled to r_at (no bucket: a full one)
    SELECT coalesce(array_agg(d.k), '{}'),
           coalesce(array_agg(least(d.burst::double precision,
               coalesce(b.tokens + greatest(0, extract(epoch FROM r_at - b.refilled_at))
                                   * d.rate, d.burst))), '{}'),
           coalesce(array_agg(d.rate), '{}'), coalesce(array_agg(d.burst), '{}')
    INTO r_keys, r_tokens, r_rates, r_bursts
    FROM (SELECT DISTINCT ON (t.k) t.k, t.rate, t.burst
          FROM unnest(p_rkeys, p_rates, p_bursts) AS t(k, rate, burst)
          WHERE t.k IS NOT NULL ORDER BY t.k) AS d
    LEFT JOIN rate_buckets AS b ON b.key = d.k;
    -- 4. in the batch's order: a slot and a token, or the limit that refuses
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        CONTINUE WHEN p_ids[i] = ANY(blocked);  -- the caller inspects its row
        cpos := array_position(c_keys, p_ckeys[i]);
        rpos := array_position(r_keys, p_rkeys[i]);
        IF cpos IS NOT NULL AND c_live[cpos] >= p_climits[i] THEN
            execution_id := p_ids[i]::text; token := NULL; cancelled := false;
            waiting := 'concurrency'; retry_in_s := NULL;
            RETURN NEXT;
        ELSIF rpos IS NOT NULL AND r_tokens[rpos] < 1 THEN
            execution_id := p_ids[i]::text; token := NULL; cancelled := false;
            waiting := 'rate'; retry_in_s := (1 - r_tokens[rpos]) / p_rates[i];
            RETURN NEXT;
        ELSE
            admitted := admitted || i;
            IF cpos IS NOT NULL THEN
                c_live[cpos] := c_live[cpos] + 1;
            END IF;
            IF rpos IS NOT NULL THEN
                r_tokens[rpos] := r_tokens[rpos] - 1;
            END IF;
        END IF;
    END LOOP;
    -- 5. the admitted leases, inserted or taken over with their key in one statement, as the
    -- plain claim does (its condition again: step 1 ran without the rows' locks; a row taken
    -- meanwhile is not returned, the caller inspects it, and its slot and token count as
    -- used until the batch ends: only ever fewer start, never more)
    RETURN QUERY
    WITH claimed AS (
        INSERT INTO leases AS l
            (execution_id, attempt, owner, fencing_token, expires_at, state, claimed_at,
             updated_at, job_id, dag_run_id, concurrency_key)
        SELECT p_ids[j], p_attempts[j], p_owner, nextval('lease_fencing_tokens'),
               now() + make_interval(secs => p_ttl_s), 'held', now(), now(), p_jobs[j],
               p_runs[j], p_ckeys[j]
        FROM unnest(admitted) AS j ORDER BY p_ids[j]
        ON CONFLICT ON CONSTRAINT leases_pkey DO UPDATE
        SET attempt = excluded.attempt, owner = excluded.owner,
            fencing_token = excluded.fencing_token, expires_at = excluded.expires_at,
            state = 'held', outcome = NULL, result = NULL, claimed_at = now(),
            updated_at = now(), job_id = excluded.job_id, dag_run_id = excluded.dag_run_id,
            concurrency_key = excluded.concurrency_key
        WHERE l.attempt < excluded.attempt
           OR (l.attempt = excluded.attempt AND l.state = 'held' AND l.expires_at < now())
        RETURNING l.execution_id::text AS e, l.fencing_token AS tok,
                  l.cancel_requested_at IS NOT NULL AS canc
    )
    SELECT c.e, c.tok, c.canc, NULL::text, NULL::double precision FROM claimed AS c;
    -- 6. the buckets as this batch left them
    INSERT INTO rate_buckets AS b (key, tokens, refilled_at, full_at)
    SELECT t.k, t.tokens, r_at, r_at + make_interval(secs => (t.burst - t.tokens) / t.rate)
    FROM unnest(r_keys, r_tokens, r_rates, r_bursts) AS t(k, tokens, rate, burst)
    ON CONFLICT (key) DO UPDATE
    SET tokens = excluded.tokens, refilled_at = excluded.refilled_at, full_at = excluded.full_at;
END;
$$;
