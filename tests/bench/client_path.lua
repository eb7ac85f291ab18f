-- client_path.lua: wrk's side of tests/bench/client_path.py: one request
-- shape per run, METHOD (GET) and BODY (none) from the environment.
package.path = (os.getenv("BENCH_DIR") or ".") .. "/?.lua;" .. package.path
local common = require("http_common")
wrk.method = os.getenv("METHOD") or "GET"
local body = os.getenv("BODY")
if body and body ~= "" then wrk.body = body end
common.setup_headers()
done = common.done(1, "requests")
