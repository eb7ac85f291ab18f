-- incident_triage_test.lua: tests of incident_triage.lua (run: moonloop test skills/).
-- Shapes follow tests/lib/standins.py; see docs/testing.md for the test API.
local t = test.skill("incident_triage.lua", { env = {
  METRICS_URL = "http://metrics.test", DEPLOYS_URL = "http://deploys.test",
  CHAT_WEBHOOK = "http://chat.test/hook", OPS_WEBHOOK = "http://ops.test/hook",
  TRIAGE_BACKOFF = false, -- granted, not set: the default backoff
} })

local INPUT = { service = "checkout", health = "degraded", reasons = { "checkout: latency_ms 1850 over 500" } }
local DETAILED = {
  service = { name = "checkout", error_rate = 0.031, latency_ms = 1850 },
  endpoints = { { path = "/pay", p95_ms = 2590, errors = 41 } },
  pool = { db_connections_in_use = 98, db_connections_max = 100 },
}
local DEPLOYS = { deploys = {
  { id = "4f2a9c1", service = "checkout", author = "dana", minutes_ago = 14,
    change = "switch payment client to the new connection pool" },
} }
local ANALYSIS = {
  root_cause = "deploy 4f2a9c1 exhausts the database pool",
  severity = "high",
  actions = { "roll back 4f2a9c1", "add a pool saturation alert" },
}
local DETAILED_URL = "GET http://metrics.test/detailed?service=checkout"

-- The request whose URL contains `part` (the n-th such, default the first).
local function request(c, part, n, which)
  local seen = 0
  for _, r in ipairs(c:requests(which)) do
    if r.url:find(part, 1, true) then
      seen = seen + 1
      if seen == (n or 1) then return r end
    end
  end
  c:fail("no request to " .. part)
end

t:before_each(function(c)
  c:http("GET http://deploys.test/deploys?since=2h", { json = DEPLOYS })
  c:http("POST http://chat.test/hook", { json = { ok = true } })
  c:http("POST http://ops.test/hook", { json = { ok = true } })
end)

t:case("posts a summary with severity, service, root cause and actions", function(c)
  c:http(DETAILED_URL, { json = DETAILED })
  c:llm(ANALYSIS)
  local out = c:run(INPUT)
  c:steps({ "fetch-detailed-metrics", "fetch-deploys", "correlate", "post-summary" })
  c:eq(out, { service = "checkout", root_cause = ANALYSIS.root_cause, severity = "high", actions = ANALYSIS.actions })
  local post = request(c, "chat.test/hook")
  c:eq(post.json, {
    text = "[high] checkout: likely cause: deploy 4f2a9c1 exhausts the database pool. "
      .. "Recommended: roll back 4f2a9c1; add a pool saturation alert",
    service = "checkout", key = c:trace().id .. ":post-summary",
  })
  -- The LLM was given the reasons, the detailed metrics and the deploys.
  local prompt = request(c, "/chat/completions").json.messages[2].content
  for _, want in ipairs({ "SERVICE: checkout", "latency_ms 1850 over 500", '"db_connections_in_use":98', '"id":"4f2a9c1"' }) do
    c:ok(prompt:find(want, 1, true), "the prompt lacks " .. want)
  end
  c:eq(c:on_failure(), nil)
end)

t:case("started by the triage event, the event's data is the input", function(c)
  c:http(DETAILED_URL, { json = DETAILED })
  c:llm(ANALYSIS)
  local out = c:run(INPUT, { event = "infra.incident.triage" })
  c:eq(out.service, "checkout")
  c:eq(request(c, "chat.test/hook").json.service, "checkout")
end)

t:case("a metrics API failing at first is retried", function(c)
  c:http(DETAILED_URL, function(_, n)
    if n < 3 then return { status = 503, json = { error = "metrics backend unavailable" } } end
    return { json = DETAILED }
  end)
  c:llm(ANALYSIS)
  local out = c:run(INPUT)
  c:eq(c:status(), "completed")
  c:eq(out.severity, "high")
  local fetch = c:step("fetch-detailed-metrics")
  c:eq(fetch.status, "completed")
  c:eq(fetch.attempts, 3)
  c:ok(fetch.failures[1].error:find("returned 503", 1, true), fetch.failures[1].error)
  c:eq(fetch.duration, 2 + 4)  -- backoff "2s", doubled
  c:eq(c:step("correlate").output.root_cause, ANALYSIS.root_cause)
end)

t:case("an analysis without root_cause fails the correlate step", function(c)
  c:http(DETAILED_URL, { json = DETAILED })
  c:llm({ severity = "high", actions = { "roll back 4f2a9c1" } })
  local out = c:run(INPUT)
  c:eq(out, nil)
  c:err("step 'correlate' failed: ")
  c:err("the LLM's analysis is missing root_cause, severity or actions")
  c:steps({ "fetch-detailed-metrics", "fetch-deploys", "correlate" })
  c:eq(c:step("correlate").status, "failed")
  c:eq(c:step("correlate").attempts, 4)  -- retries = 3
  for _, r in ipairs(c:requests()) do
    c:ok(not r.url:find("chat.test", 1, true), "nothing is posted to the chat")
  end
end)

t:case("a severity outside low..critical fails the correlate step", function(c)
  c:http(DETAILED_URL, { json = DETAILED })
  c:llm({ root_cause = "the pool", severity = "catastrophic", actions = {} })
  c:run(INPUT)
  c:err("the LLM's analysis is missing root_cause, severity or actions")
end)

t:case("the metrics API staying down fails the run and on_failure tells ops", function(c)
  c:http(DETAILED_URL, { status = 503, json = { error = "metrics backend unavailable" } })
  local out = c:run(INPUT)
  c:eq(out, nil)
  c:eq(c:status(), "failed")
  local err = c:err("step 'fetch-detailed-metrics' failed: ")
  c:steps({ "fetch-detailed-metrics" })
  c:eq(c:step("fetch-detailed-metrics").attempts, 4)
  -- The on_failure run posted once to the ops webhook, naming the service and the error.
  c:steps({ "notify-ops" }, "on_failure")
  c:eq(c:on_failure().status, "completed")
  local ops = request(c, "ops.test/hook", 1, "on_failure")
  c:eq(ops.method, "POST")
  c:eq(ops.json.text, "incident triage failed for checkout: " .. err)
  c:ok(ops.json.text:find("returned 503", 1, true), ops.json.text)
  c:eq(ops.json.services, { "checkout" })
  c:eq(ops.json.key, c:on_failure().run_id .. ":notify-ops")
end)

return t
