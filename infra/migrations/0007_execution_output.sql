-- duetime schema, version 7: what an execution produced, visible (issue 14.5).
--
-- output_json: the latest attempt's return value as the worker published it (JSON text, already
-- capped at 64 KiB by the worker). Text, not jsonb: a task may return NaN or Infinity, which
-- Python's json writes and PostgreSQL's jsonb refuses; the reader decides how to show it.
-- traceback: the latest attempt's bounded, redacted traceback (8 KiB at most, see
-- duetime.consumers.worker.results.task_traceback). Only the latest attempt's is kept: the
-- attempts history stays small, so list reads stay cheap.
-- Both are NULL for executions projected before this version until a rebuild fills them
-- (the results topic still holds them for its retention).
ALTER TABLE executions ADD COLUMN output_json text;
ALTER TABLE executions ADD COLUMN traceback text;
