-- health_check.lua: the heartbeat of the loop. Every 30 minutes it fetches
-- the services' metrics, asks the LLM to classify overall health (normal,
-- degraded or critical, with reasons), falls back to rules when the LLM
-- fails or answers nonsense, and invokes incident triage for each affected
-- service that has no triage under way or just done.
--
-- Configuration (env): METRICS_URL; HEALTH_CRON (default every 30 minutes);
-- TRIAGE_COOLDOWN: how long after a triage a service is not triaged again
-- (default "2h"). The configuration grants all of them (an optional one
-- may be left unset: it reads as nil). The thresholds below are what the review loop tunes.

local THRESHOLDS = {
  error_rate = 0.05,  -- share of requests that fail
  latency_ms = 500,   -- p95 latency
  memory = 0.90,      -- share of memory in use
  cpu = 0.90,         -- share of CPU in use
}

local HEALTH = { normal = true, degraded = true, critical = true }

-- The rule-based classification: a service is affected when any metric is
-- over its threshold, critical when one is at least four times it.
local function classify_by_rules(services)
  local affected, reasons, health = {}, {}, "normal"
  for _, s in ipairs(services) do
    local why, worst = {}, 0
    for metric, limit in pairs(THRESHOLDS) do
      local v = tonumber(s[metric])
      if v and v > limit then
        why[#why + 1] = ("%s %s over %s"):format(metric, tostring(v), tostring(limit))
        worst = math.max(worst, v / limit)
      end
    end
    if #why > 0 then
      table.sort(why)
      affected[#affected + 1] = s.name
      reasons[#reasons + 1] = s.name .. ": " .. table.concat(why, ", ")
      local level = worst >= 4 and "critical" or "degraded"
      if level == "critical" or health == "normal" then health = level end
    end
  end
  return { health = health, affected = affected, reasons = reasons, source = "rules" }
end

-- Whether an LLM answer is a usable classification.
local function valid(v)
  if type(v) ~= "table" or not HEALTH[v.health] or type(v.affected) ~= "table" then return false end
  for _, name in ipairs(v.affected) do
    if type(name) ~= "string" or name == "" or name:find("#", 1, true) then return false end
  end
  return v.health == "normal" or #v.affected > 0
end

return {
  id = "health-check",
  description = "Fetch service metrics, classify health with the LLM (rules as fallback), invoke triage",
  triggers = { { cron = env.HEALTH_CRON or "*/30 * * * *" } },
  retries = 2,
  backoff = "1s",
  run = function(ctx)
    local metrics = ctx.step.run("fetch-metrics", function()
      return http.get_json(env.METRICS_URL .. "/metrics")
    end)

    local verdict = ctx.step.run("classify", function()
      local ok, answer = pcall(llm.chat, {
        system = "You watch production services. Answer only JSON.",
        prompt = "Classify the overall health of these services as normal, degraded or critical. "
          .. "Answer {\"health\": ..., \"affected\": [service names], \"reasons\": [short strings]}.\n"
          .. "Thresholds: " .. json.encode(THRESHOLDS) .. "\nMETRICS: " .. json.encode(metrics),
        json = true,
      })
      if ok and valid(answer.json) then
        answer.json.source = "llm"
        return answer.json
      end
      log.warn(ok and "the LLM's classification is not usable; falling back to rules"
        or ("the LLM failed (" .. tostring(answer) .. "); falling back to rules"))
      return classify_by_rules(metrics.services)
    end, { retries = 0 })
    log.info(("health %s by %s: %s"):format(verdict.health, verdict.source,
      #verdict.affected > 0 and table.concat(verdict.affected, ", ") or "no service affected"))
    if verdict.health == "normal" then return verdict end

    -- One triage per incident: skip services triaged lately (or being triaged).
    local busy = ctx.step.run("recent-triages", function()
      local recent = {}
      for _, r in ipairs(runs.list{ skill = "incident-triage", since = env.TRIAGE_COOLDOWN or "2h", limit = 500 }) do
        if type(r.input) == "table" and r.input.service and r.status ~= "failed" and r.status ~= "cancelled" then
          recent[r.input.service] = r.id
        end
      end
      return recent
    end)

    local triaged = {}
    for _, service in ipairs(verdict.affected) do
      if not busy[service] then
        -- A failed triage is reported by triage's own on_failure; the heartbeat goes on.
        local ok, result = pcall(ctx.step.invoke, "triage-" .. service, {
          skill = "incident-triage",
          data = { service = service, health = verdict.health, reasons = verdict.reasons },
          timeout = "1h",
        })
        triaged[#triaged + 1] = { service = service, ok = ok,
          severity = ok and type(result) == "table" and result.severity or nil }
      end
    end
    verdict.triaged = json.array(triaged)
    return verdict
  end,
}
