-- duetime schema, version 11: unique jobs and debounce (issue 18, item 3).
--
-- job_keys: one row per (kind, key) for the jobs created with `unique` or `debounce`, kept by
-- the API alone (producers/api/uniqueness.py). Every API process creating a job with a key
-- takes this row's lock in the transaction that inserts the job's row, so two creates of one
-- key (from any number of API processes) are serialised here, never by an advisory lock:
--   unique:   the row names the first job of the window; a create inside the window
--             (window_ends_at in the future) returns that job and creates nothing; one after
--             it takes the row over and starts a new window.
--   debounce: the row names the latest job of the window; a create inside the window
--             cancels that job, replaces it in the row and re-arms the window (trailing
--             edge: only the last job, due at the window's end, runs).
-- A row whose window has ended means nothing; creates delete a few of them as they go.
CREATE TABLE job_keys (
    kind            text NOT NULL CHECK (kind IN ('unique', 'debounce')),
    key             text NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    job_id          uuid NOT NULL,
    window_ends_at  timestamptz NOT NULL,
    PRIMARY KEY (kind, key)
);
CREATE INDEX job_keys_window_ends_at ON job_keys (window_ends_at);
