-- service_check_test.lua: tests of service_check.lua (run: moonloop test skills/).
-- See docs/testing.md for the test API.
local t = test.skill("service_check.lua", {
  env = { METRICS_URL = "http://metrics.test", CHAT_WEBHOOK = "http://chat.test/hook" },
})

local SLOW_API = { services = {
  { name = "api", error_rate = 0.2, latency_ms = 900 },
  { name = "db", error_rate = 0.0, latency_ms = 12 },
} }

t:case("flags a slow service", function(c)
  c:mock("fetch-metrics", SLOW_API)
  c:mock("confirm", { "api" })
  c:mock("post-summary", { ok = true })
  local out = c:run({})
  c:eq(out.unhealthy, { "api" })
  c:eq(out.checked, 2)
  c:steps({ "fetch-metrics", "settle", "confirm", "post-summary" })
  c:eq(c:logs()[1].msg, "1 of 2 services look unhealthy")
end)

t:case("reports all healthy when nothing is confirmed", function(c)
  c:mock("fetch-metrics", SLOW_API)
  c:mock("confirm", {})
  c:mock("post-summary", function() return { ok = true } end)
  local out = c:run({})
  c:eq(#out.unhealthy, 0)
end)

t:case("runs the real step bodies against mocked HTTP", function(c)
  local n = 0
  c:http("GET http://metrics.test/metrics", function()
    n = n + 1
    -- The first look sees api slow; the second, after the settle sleep, db recovered too.
    if n == 1 then return { json = SLOW_API } end
    return { json = { services = { { name = "api", error_rate = 0.3, latency_ms = 950 } } } }
  end)
  c:http("POST http://chat.test/hook", { status = 200, json = { ok = true } })
  local out = c:run({})
  c:eq(out, { unhealthy = { "api" }, checked = 2 })
  local post = c:requests()[3]
  c:eq(post.method, "POST")
  c:eq(post.json.text, "unhealthy: api")
  -- ctx.step_key is stable per run and step: the chat service can drop duplicates.
  c:eq(post.json.key, c:trace().id .. ":post-summary")
end)

t:case("retries a flaky metrics fetch with backoff", function(c)
  c:mock("fetch-metrics", function(attempt)
    if attempt < 3 then error("metrics unavailable") end
    return SLOW_API
  end)
  c:mock("confirm", { "api" })
  c:mock("post-summary", { ok = true })
  c:run({})
  local fetch = c:step("fetch-metrics")
  c:eq(fetch.attempts, 3)
  c:eq(fetch.status, "completed")
  c:ok(fetch.failures[1].error:find("metrics unavailable", 1, true), fetch.failures[1].error)
  -- backoff = "300ms": 300ms, then 600ms, on the virtual clock.
  c:eq(fetch.duration, 0.9)
end)

t:case("fails after its retries when chat is down", function(c)
  c:mock("fetch-metrics", SLOW_API)
  c:mock("confirm", { "api" })
  c:http("POST http://chat.test/hook", { status = 503, body = "unavailable" })
  local out = c:run({})
  c:eq(out, nil)
  c:err("step 'post-summary' failed: http.post_json: POST http://chat.test/hook returned 503")
  c:eq(c:step("post-summary").attempts, 4) -- retries = 3
  c:eq(c:status(), "failed")
end)

t:case("the settle sleep passes on the virtual clock", function(c)
  c:mock("fetch-metrics", SLOW_API)
  c:mock("confirm", {})
  c:mock("post-summary", { ok = true })
  local before = c:now()
  c:run({})
  c:eq(c:step("settle").duration, 2)
  c:eq(c:now() - before, 2)
end)

t:case("an unmocked request fails the step with a clear error", function(c)
  c:mock("fetch-metrics", SLOW_API)
  c:run({})
  c:err("GET http://metrics.test/metrics is not mocked in this test")
end)

return t
