-- http_common.lua: shared by the wrk scripts of tests/bench/http_*.sh.
-- Prints one line "RESULT key=value ..." that the shell scripts check:
-- errors counts non-2xx answers and socket errors together.
local M = {}

function M.setup_headers()
  wrk.headers["Content-Type"] = "application/json"
  local token = os.getenv("MOONLOOP_TOKEN")
  if token and token ~= "" then wrk.headers["Authorization"] = "Bearer " .. token end
end

function M.done(per_request, unit)
  return function(summary, latency, requests)
    local secs = summary.duration / 1e6
    local e = summary.errors
    local errors = e.status + e.connect + e.read + e.write + e.timeout
    local ok = summary.requests - e.status
    io.write(string.format(
      "RESULT requests=%d seconds=%.2f req_per_s=%.0f %s_per_s=%.0f " ..
      "p50_ms=%.2f p90_ms=%.2f p99_ms=%.2f max_ms=%.2f errors=%d\n",
      summary.requests, secs, summary.requests / secs, unit, ok * per_request / secs,
      latency:percentile(50) / 1000, latency:percentile(90) / 1000,
      latency:percentile(99) / 1000, latency.max / 1000, errors))
  end
end

return M
