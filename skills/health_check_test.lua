-- health_check_test.lua: tests of health_check.lua (run: moonloop test skills/).
-- Metrics shapes follow tests/lib/standins.py; see docs/testing.md for the test API.
-- HEALTH_CRON and TRIAGE_COOLDOWN are granted but not set (false): the skill's defaults.
local t = test.skill("health_check.lua", { env = {
  METRICS_URL = "http://metrics.test", HEALTH_CRON = false, TRIAGE_COOLDOWN = false,
} })

local function svc(name, over)
  local s = { name = name, error_rate = 0.004, latency_ms = 120, memory = 0.61, cpu = 0.42 }
  for k, v in pairs(over or {}) do s[k] = v end
  return s
end

local HEALTHY = { services = { svc("api"), svc("checkout"), svc("search") } }
-- The night-time spike of the stand-ins: checkout's p95 at 1850 ms (3.7 times 500).
local SPIKE = { services = { svc("api"), svc("checkout", { error_rate = 0.031, latency_ms = 1850 }), svc("search") } }

local function metrics(c, value)
  c:http("GET http://metrics.test/metrics", { json = value })
end

local function triage_ok(c)
  c:child("incident-triage", function(data) return { service = data.service, severity = "high" } end)
end

local function llm_down(c)
  c:http("POST http://llm.test/v1/chat/completions", { status = 503, json = { error = { message = "model overloaded" } } })
end

t:case("normal metrics: the LLM says normal, nothing is triaged", function(c)
  metrics(c, HEALTHY)
  c:llm({ health = "normal", affected = {}, reasons = {} })
  local out = c:run({})
  c:eq(out.health, "normal")
  c:eq(out.source, "llm")
  c:steps({ "fetch-metrics", "classify" })
  c:eq(#c:invoked(), 0)
  -- The LLM saw the metrics and the thresholds.
  local prompt = c:requests()[2].json.messages[2].content
  c:ok(prompt:find('"latency_ms":500', 1, true), prompt)
  c:ok(prompt:find('"name":"checkout"', 1, true), prompt)
end)

t:case("normal metrics with the LLM down: the rules find nothing either", function(c)
  metrics(c, HEALTHY)
  llm_down(c)
  local out = c:run({})
  c:eq(out, { health = "normal", affected = {}, reasons = {}, source = "rules" })
  c:eq(#c:invoked(), 0)
end)

t:case("each service the LLM calls degraded is triaged once, with its data", function(c)
  metrics(c, SPIKE)
  c:llm({ health = "degraded", affected = { "checkout", "api" },
          reasons = { "checkout: latency_ms above threshold", "api: errors" } })
  c:mock("recent-triages", {})
  triage_ok(c)
  local out = c:run({})
  c:steps({ "fetch-metrics", "classify", "recent-triages", "triage-checkout", "triage-api" })
  local inv = c:invoked()
  c:eq(#inv, 2)
  c:eq(inv[1], { skill = "incident-triage", step = "triage-checkout", data = { service = "checkout",
    health = "degraded", reasons = { "checkout: latency_ms above threshold", "api: errors" } } })
  c:eq(inv[2].data.service, "api")
  c:eq(out.source, "llm")
  c:eq(out.triaged, { { service = "checkout", ok = true, severity = "high" },
                      { service = "api", ok = true, severity = "high" } })
end)

t:case("the LLM failing: rules classify, naming the metric over its threshold", function(c)
  metrics(c, SPIKE)
  llm_down(c)
  c:mock("recent-triages", {})
  triage_ok(c)
  local out = c:run({})
  c:eq(out.source, "rules")
  c:eq(out.health, "degraded")  -- 3.7 times the threshold: not critical
  c:eq(out.affected, { "checkout" })
  c:eq(out.reasons, { "checkout: latency_ms 1850 over 500" })
  c:eq(c:invoked()[1].data, { service = "checkout", health = "degraded", reasons = out.reasons })
  -- The skill's own line (llm.chat's retries are logged before it).
  local warn
  for _, l in ipairs(c:logs()) do
    if l.msg:find("the LLM failed", 1, true) then warn = l end
  end
  c:ok(warn, "no log line says the LLM failed")
  c:eq(warn.level, "warn")
  c:ok(warn.msg:find("falling back to rules", 1, true), warn.msg)
end)

t:case("the LLM answering nonsense: rules, critical over four times a threshold", function(c)
  metrics(c, { services = {
    svc("api", { latency_ms = 600 }),                       -- degraded
    svc("checkout", { error_rate = 0.22, latency_ms = 900 }),  -- error rate 4.4 times 0.05
    svc("search", { cpu = 0.95, memory = 0.97, latency_ms = 510 }),
  } })
  c:llm("Honestly it is hard to say, the services seem fine-ish? Maybe check back later.")
  c:mock("recent-triages", {})
  triage_ok(c)
  local out = c:run({})
  c:eq(out.source, "rules")
  c:eq(out.health, "critical")
  c:eq(out.affected, { "api", "checkout", "search" })
  c:eq(out.reasons, { "api: latency_ms 600 over 500",
                      "checkout: error_rate 0.22 over 0.05, latency_ms 900 over 500",
                      "search: cpu 0.95 over 0.9, latency_ms 510 over 500, memory 0.97 over 0.9" })
  c:steps({ "fetch-metrics", "classify", "recent-triages", "triage-api", "triage-checkout", "triage-search" })
  c:eq(c:invoked()[2].data.health, "critical")
end)

t:case("a JSON answer that is not a usable classification: rules", function(c)
  metrics(c, SPIKE)
  -- Degraded with no service named, then an unknown health: both unusable.
  c:llm({ health = "degraded", affected = {} })
  c:mock("recent-triages", {})
  triage_ok(c)
  local out = c:run({})
  c:eq(out.source, "rules")
  c:eq(out.affected, { "checkout" })
  c:ok(c:logs()[1].msg:find("not usable", 1, true), c:logs()[1].msg)

  c:llm({ health = "unknown", affected = { "checkout" } })
  out = c:run({})
  c:eq(out.source, "rules")
end)

t:case("a service triaged lately is not triaged again", function(c)
  metrics(c, SPIKE)
  c:llm({ health = "degraded", affected = { "checkout", "api" }, reasons = {} })
  c:mock("recent-triages", { checkout = "01JTRIAGEDCHECKOUT000000000" })
  triage_ok(c)
  local out = c:run({})
  c:steps({ "fetch-metrics", "classify", "recent-triages", "triage-api" })
  c:eq(#c:invoked(), 1)
  c:eq(c:invoked()[1].data.service, "api")
  c:eq(out.triaged, { { service = "api", ok = true, severity = "high" } })
end)

t:case("every affected service triaged lately: no invoke at all", function(c)
  metrics(c, SPIKE)
  llm_down(c)
  c:mock("recent-triages", { checkout = "01JTRIAGEDCHECKOUT000000000" })
  local out = c:run({})
  c:eq(c:status(), "completed")
  c:eq(#c:invoked(), 0)
  c:eq(out.triaged, {})
end)

t:case("a failing triage does not fail the health check", function(c)
  metrics(c, SPIKE)
  c:llm({ health = "degraded", affected = { "checkout", "api" }, reasons = {} })
  c:mock("recent-triages", {})
  c:child("incident-triage", function(data)
    if data.service == "checkout" then error("metrics API down") end
    return { severity = "low" }
  end)
  local out = c:run({})
  c:eq(c:status(), "completed")
  c:eq(out.triaged, { { service = "checkout", ok = false }, { service = "api", ok = true, severity = "low" } })
  c:eq(#c:invoked(), 2)
end)

t:case("a triage outlasting its hour does not hold the heartbeat", function(c)
  metrics(c, SPIKE)
  llm_down(c)
  c:mock("recent-triages", {})
  c:child("incident-triage", { severity = "high" }, { after = "3h" })
  local out = c:run({})
  c:eq(c:status(), "completed")
  c:eq(out.triaged, { { service = "checkout", ok = false } })
  c:eq(c:step("triage-checkout").duration, 3600)  -- the invoke's timeout, not the child's 3h
end)

t:case("a flaky metrics API is retried", function(c)
  c:http("GET http://metrics.test/metrics", function(_, n)
    if n == 1 then return { status = 503, json = { error = "metrics backend unavailable" } } end
    return { json = HEALTHY }
  end)
  c:llm({ health = "normal", affected = {} })
  local out = c:run({})
  c:eq(out.health, "normal")
  c:eq(c:step("fetch-metrics").attempts, 2)
  c:ok(c:step("fetch-metrics").failures[1].error:find("503", 1, true), c:step("fetch-metrics").failures[1].error)
end)

return t
