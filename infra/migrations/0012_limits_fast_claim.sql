-- duetime schema, version 12: a cheaper limited claim (issue 18: the cost of limits per key).
--
-- duetime_claim_limited keeps its signature, its answers and every guarantee of version 9
-- (0009_limits.sql says which); what changes is the work a batch does, most of it while it
-- holds its keys' locks (every other batch of those keys waits for it). Measured with
-- auto_explain on a batch of 250 executions of 20 keys, as bench/limits.py claims them:
--   1. the check of the leases that are not claimable was planned as a hash join over a
--      sequential scan of the whole leases table (6.4 of the batch's 25 ms at 8,500 rows, and
--      growing with every lease kept until the purge: the bench's database holds 10,000 more
--      per run). It now probes the primary key with the batch's ids, and only when a limit
--      may refuse someone (below);
--   2. the admission loop (one PL/pgSQL iteration per execution) runs only when a limit may
--      refuse someone in this batch. First one query ranks every execution of the batch
--      within its concurrency key and within its rate key (batch order); when every rank
--      fits (the key's live slots + the rank <= the execution's limit, and the rank <= its
--      bucket's tokens), the loop would admit them all, so they all go to the insert at
--      once. An execution whose lease is not claimable counts in that test as if it were
--      (a test that can only fail more often: then the loop decides, as in version 9);
--   3. a bucket is charged one token per lease the insert actually took (read from the
--      insert's own rows, in the same statement), no longer per execution admitted: a row
--      taken meanwhile by someone else no longer spends a token for nothing. The slots are
--      counted from the leases as before, so either way only ever fewer start, never more.
CREATE OR REPLACE FUNCTION duetime_claim_limited(
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
    all_fit boolean;
    -- per key, read once for the batch (a batch holds many executions of few keys), then
    -- counted here; the buckets are written back once at the end
    c_keys text[];
    c_live int[];
    r_keys text[];
    r_tokens double precision[];
    r_left double precision[];
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
    -- 1. the keys' slots: expired holders give theirs up (fenced out by a new token)
    UPDATE leases AS l
    SET fencing_token = nextval('lease_fencing_tokens'), concurrency_key = NULL,
        updated_at = now()
    WHERE l.concurrency_key = ANY(p_ckeys) AND l.state = 'held' AND l.expires_at < now();
    SELECT coalesce(array_agg(d.k), '{}'), coalesce(array_agg(
               (SELECT count(*)::int FROM leases AS l
                WHERE l.concurrency_key = d.k AND l.state = 'held')), '{}')
    INTO c_keys, c_live
    FROM (SELECT DISTINCT k FROM unnest(p_ckeys) AS k WHERE k IS NOT NULL) AS d;
    -- 2. the keys' buckets, refilled to r_at (no bucket: a full one)
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
    -- 3a. would every execution of the batch fit? (its rank within its key, batch order)
    SELECT coalesce(bool_and((q.ck IS NULL OR c.n + q.crank <= q.cl)
                             AND (q.rk IS NULL OR q.rrank <= r.tokens)), true)
    INTO all_fit
    FROM (SELECT t.ck, t.cl, t.rk,
                 row_number() OVER (PARTITION BY t.ck ORDER BY t.i) AS crank,
                 row_number() OVER (PARTITION BY t.rk ORDER BY t.i) AS rrank
          FROM unnest(p_ckeys, p_climits, p_rkeys) WITH ORDINALITY AS t(ck, cl, rk, i)) AS q
    LEFT JOIN unnest(c_keys, c_live) AS c(k, n) ON c.k = q.ck
    LEFT JOIN unnest(r_keys, r_tokens) AS r(k, tokens) ON r.k = q.rk;
    IF all_fit THEN
        admitted := ARRAY(SELECT generate_series(1, coalesce(array_length(p_ids, 1), 0)));
    ELSE
        -- 3b. some limit may refuse someone: the leases not claimable as in the plain claim
        -- (held, done, or a newer attempt; the = ANY probes the primary key per id) are left
        -- to the caller, and in the batch's order the others get a slot and a token, or the
        -- limit that refuses (version 9's loop; r_left: the tokens left as it goes)
        SELECT coalesce(array_agg(t.e), '{}') INTO blocked
        FROM unnest(p_ids, p_attempts) AS t(e, a) JOIN leases AS l ON l.execution_id = t.e
        WHERE l.execution_id = ANY(p_ids)
          AND NOT (l.attempt < t.a
                   OR (l.attempt = t.a AND l.state = 'held' AND l.expires_at < now()));
        r_left := r_tokens;
        FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
            CONTINUE WHEN p_ids[i] = ANY(blocked);  -- the caller inspects its row
            cpos := array_position(c_keys, p_ckeys[i]);
            rpos := array_position(r_keys, p_rkeys[i]);
            IF cpos IS NOT NULL AND c_live[cpos] >= p_climits[i] THEN
                execution_id := p_ids[i]::text; token := NULL; cancelled := false;
                waiting := 'concurrency'; retry_in_s := NULL;
                RETURN NEXT;
            ELSIF rpos IS NOT NULL AND r_left[rpos] < 1 THEN
                execution_id := p_ids[i]::text; token := NULL; cancelled := false;
                waiting := 'rate'; retry_in_s := (1 - r_left[rpos]) / p_rates[i];
                RETURN NEXT;
            ELSE
                admitted := admitted || i;
                IF cpos IS NOT NULL THEN
                    c_live[cpos] := c_live[cpos] + 1;
                END IF;
                IF rpos IS NOT NULL THEN
                    r_left[rpos] := r_left[rpos] - 1;
                END IF;
            END IF;
        END LOOP;
    END IF;
    -- 4. the admitted leases, inserted or taken over with their key in one statement, as the
    -- plain claim does (its condition again: a row not claimable, or taken meanwhile, is not
    -- returned and the caller inspects it); 5. in the same statement, the buckets as this
    -- batch left them: one token spent per lease taken
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
        RETURNING l.execution_id AS e, l.fencing_token AS tok,
                  l.cancel_requested_at IS NOT NULL AS canc
    ), spent AS (
        SELECT t.rk, count(*)::int AS n
        FROM claimed AS c JOIN unnest(p_ids, p_rkeys) AS t(e, rk) ON t.e = c.e
        WHERE t.rk IS NOT NULL GROUP BY t.rk
    ), buckets AS (
        INSERT INTO rate_buckets AS b (key, tokens, refilled_at, full_at)
        SELECT t.k, t.tokens - coalesce(s.n, 0), r_at,
               r_at + make_interval(secs => (t.burst - t.tokens + coalesce(s.n, 0)) / t.rate)
        FROM unnest(r_keys, r_tokens, r_rates, r_bursts) AS t(k, tokens, rate, burst)
        LEFT JOIN spent AS s ON s.rk = t.k
        ON CONFLICT (key) DO UPDATE
        SET tokens = excluded.tokens, refilled_at = excluded.refilled_at,
            full_at = excluded.full_at
    )
    SELECT c.e::text, c.tok, c.canc, NULL::text, NULL::double precision FROM claimed AS c;
END;
$$;
