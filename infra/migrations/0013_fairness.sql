-- duetime schema, version 13: fairness keys (issue 18, item 4).
--
-- jobs.fairness: the definition's fairness as the API shows it ({"key", "weight"}; NULL: none),
-- so that an update (built from the row) keeps it and GET shows it. Rows written before this
-- version have NULL: they had no fairness key. Nothing else is stored: the scheduler holds and
-- releases executions from its own state (the changelog), the workers from the request.
ALTER TABLE jobs ADD COLUMN fairness jsonb;
