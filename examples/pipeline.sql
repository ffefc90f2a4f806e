-- A clickstream, counted per user and kept in the hotstate table clicks_per_user.
--
--   hotstate cluster up --servers 3
--   hotstate sql -f examples/pipeline.sql --available-now     # the files there now, then return
--   hotstate sql -f examples/pipeline.sql                     # or keep running (Ctrl-C stops)
--   hotstate query "SELECT * FROM clicks_per_user WHERE user = 'ana'"
--
-- Run from the repository root (paths are relative to the working directory). New files dropped into
-- examples/data/clicks/ (written elsewhere, then renamed in) are picked up as they arrive.

CREATE SOURCE clicks (user STRING, url STRING, ts TIMESTAMP)
  WITH (format='json', path='examples/data/clicks/', maxFilesPerTrigger=10);   -- also csv, parquet, rate

-- The key is the GROUP BY column: one row per user, updated as clicks arrive.
CREATE TABLE clicks_per_user WITH (partitions=8, standby_replicas=1, acceptable_lag=1000) AS
  SELECT user, count(*) AS clicks, approx_count_distinct(url) AS pages, max(ts) AS last_seen
  FROM clicks
  GROUP BY user;
