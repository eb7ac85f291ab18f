-- http_invoke.lua: POST /v1/skills/bench/invoke with {"wait": true}: the
-- round trip of starting a run, its durable step, and its answer.
package.path = (os.getenv("BENCH_DIR") or ".") .. "/?.lua;" .. package.path
local common = require("http_common")
wrk.method = "POST"
wrk.body = '{"data":{"n":7},"wait":true}'
common.setup_headers()
done = common.done(1, "runs")
