-- http_events.lua: POST /v1/events with BATCH events per request (default 1).
-- EVENT names the event (default bench.noop, which starts no run).
package.path = (os.getenv("BENCH_DIR") or ".") .. "/?.lua;" .. package.path
local common = require("http_common")
local batch = tonumber(os.getenv("BATCH") or "1")
local name = os.getenv("EVENT") or "bench.noop"
local one = string.format('{"name":"%s","data":{"n":1,"text":"a small payload"}}', name)
local body = one
if batch > 1 then
  local t = {}
  for i = 1, batch do t[i] = one end
  body = "[" .. table.concat(t, ",") .. "]"
end
wrk.method = "POST"
wrk.body = body
common.setup_headers()
done = common.done(batch, "events")
