-- review_skill_performance_test.lua: tests of review_skill_performance.lua
-- (run: moonloop test skills/). runs.list cannot be mocked in skill tests,
-- so "triage-stats" is mocked; the rest runs against mocked HTTP and LLM.
local t = test.skill("review_skill_performance.lua", {
  env = { OUTCOMES_URL = "http://outcomes.test", REVIEW_CRON = false }, -- REVIEW_CRON granted, not set
})

local STATS = { total = 9, completed = 8, failed = 1, success_rate = 8 / 9, avg_duration_s = 42.5 }
local OUTCOMES = { incidents = 9, confirmed = 3, false_positives = 5, acted_on = 2,
                   note = "most false positives were latency alerts between 450 and 800 ms" }
local ADVICE = { change = true, skill = "health-check",
                 reason = "5 of 9 incidents were false positives, all latency alerts under 800 ms",
                 suggestion = "raise the latency threshold from 500 ms to 800 ms" }

local function with(base, over)
  local v = {}
  for k, x in pairs(base) do v[k] = x end
  for k, x in pairs(over) do v[k] = x end
  return v
end

-- The week's history (mocked step) and outcomes (mocked HTTP).
local function week(c)
  c:mock("triage-stats", STATS)
  c:http("GET http://outcomes.test/outcomes?since=7d", { json = OUTCOMES })
end

t:case("the triage history comes from runs.list, which needs the step mocked", function(c)
  -- The real body runs up to runs.list (its arguments pass validation), which refuses in tests.
  c:run({})
  c:err("runs.list is not available in skill tests: mock the step 'triage-stats'")
  c:steps({ "triage-stats" })
end)

t:case("no change advised: the stats and outcomes go to the LLM, nothing is updated", function(c)
  week(c)
  c:llm(with(ADVICE, { change = false }))
  local out = c:run({})
  c:eq(out, { stats = STATS, outcomes = OUTCOMES, changed = false })
  c:steps({ "triage-stats", "fetch-outcomes", "ask-for-advice" })
  c:eq(#c:invoked(), 0)
  c:eq(c:logs()[1].msg, "no change suggested")
  local prompt = c:requests()[2].json.messages[2].content
  c:ok(prompt:find('"false_positives":5', 1, true), prompt)
  c:ok(prompt:find('"total":9', 1, true) and prompt:find('"avg_duration_s":42.5', 1, true), prompt)
end)

t:case("change advised: update-skill is invoked with the suggestion", function(c)
  week(c)
  c:llm(ADVICE)
  c:child("update-skill", function(data)
    return { skill = data.skill, old_version = "aaaa", new_version = "bbbb", file = "skills/health_check.lua" }
  end)
  local out = c:run({})
  c:steps({ "triage-stats", "fetch-outcomes", "ask-for-advice", "update" })
  c:eq(c:invoked(), { { skill = "update-skill", step = "update", data = {
    skill = "health-check", reason = ADVICE.reason, suggestion = ADVICE.suggestion } } })
  c:eq(out.changed, true)
  c:eq(out.update, { skill = "health-check", old_version = "aaaa", new_version = "bbbb", file = "skills/health_check.lua" })
  c:eq(c:logs()[1].msg, "change suggested: " .. ADVICE.suggestion)
end)

t:case("advice naming no skill updates the health check", function(c)
  week(c)
  c:llm({ change = true, reason = "too noisy", suggestion = "raise latency_ms to 800" })
  c:child("update-skill", { new_version = "bbbb" })
  c:run({})
  c:eq(c:invoked()[1].data, { skill = "health-check", reason = "too noisy", suggestion = "raise latency_ms to 800" })
end)

t:case("an answer without a change verdict fails the review", function(c)
  week(c)
  c:llm({ skill = "health-check", reason = "unsure" })
  c:run({})
  c:err("the LLM's review has no 'change' verdict")
  c:eq(c:step("ask-for-advice").attempts, 3)  -- retries = 2
  c:eq(#c:invoked(), 0)
end)

t:case("a failed update fails the review", function(c)
  week(c)
  c:llm(ADVICE)
  c:child_error("update-skill", "the proposed version does not pass check: syntax error")
  c:run({})
  c:eq(c:status(), "failed")
  c:err("does not pass check")
end)

t:case("the outcomes API down fails the review before asking the LLM", function(c)
  c:mock("triage-stats", STATS)
  c:http("GET http://outcomes.test/outcomes?since=7d", { status = 503, body = "unavailable" })
  c:run({})
  c:err("step 'fetch-outcomes' failed: ")
  c:steps({ "triage-stats", "fetch-outcomes" })
  c:eq(c:step("fetch-outcomes").attempts, 3)
end)

return t
