-- incident_triage.lua: for one affected service, fetch its detailed
-- metrics and the deploys of the last two hours, ask the LLM to correlate
-- them (likely root cause, severity, recommended actions), and post a
-- summary to the chat webhook. At most one triage per service at a time.
-- When it fails for good (the metrics API stays down, say), on_failure
-- tells the ops channel.
--
-- Configuration (env): METRICS_URL, DEPLOYS_URL, CHAT_WEBHOOK, OPS_WEBHOOK;
-- TRIAGE_BACKOFF: the first retry's delay (default "2s"), granted like the
-- others (left unset, it reads as nil).

local SEVERITIES = { low = true, medium = true, high = true, critical = true }

return {
  id = "incident-triage",
  description = "Correlate a service's metrics with recent deploys, name the likely cause, post a summary",
  triggers = { { event = "infra.incident.triage" } },
  retries = 3,
  backoff = env.TRIAGE_BACKOFF or "2s",
  timeout = "1h",
  concurrency = { limit = 1, key = "event.data.service" },

  on_failure = function(ctx, err)
    local service = type(ctx.input) == "table" and ctx.input.service or "?"
    ctx.step.run("notify-ops", function()
      return http.post_json(env.OPS_WEBHOOK, {
        text = ("incident triage failed for %s: %s"):format(service, err and err.message or "unknown error"),
        -- The failed triage's run, not this on_failure run's.
        services = { service }, run_id = ctx.trigger.run_id or ctx.run_id, key = ctx.step_key,
      })
    end)
  end,

  run = function(ctx)
    local service = type(ctx.input) == "table" and ctx.input.service
    if type(service) ~= "string" or not service:match("^[%w._-]+$") then
      error(fatal("input.service must be a service name (letters, digits, '.', '_', '-')"))
    end
    local details = ctx.step.run("fetch-detailed-metrics", function()
      return http.get_json(env.METRICS_URL .. "/detailed?service=" .. service)
    end)
    local deploys = ctx.step.run("fetch-deploys", function()
      return http.get_json(env.DEPLOYS_URL .. "/deploys?since=2h")
    end)

    local analysis = ctx.step.run("correlate", function()
      local a = llm.chat{
        system = "You are an SRE triaging an incident. Answer only JSON.",
        prompt = "Correlate the incident with the deploys. Answer {\"root_cause\": string, "
          .. "\"severity\": low|medium|high|critical, \"actions\": [strings]}.\n"
          .. "SERVICE: " .. service .. "\nREASONS: " .. json.encode(ctx.input.reasons or {})
          .. "\nDETAILS: " .. json.encode(details) .. "\nDEPLOYS: " .. json.encode(deploys),
        json = true,
      }.json
      if type(a) ~= "table" or type(a.root_cause) ~= "string" or not SEVERITIES[a.severity]
        or type(a.actions) ~= "table" then
        error("the LLM's analysis is missing root_cause, severity or actions")
      end
      for _, action in ipairs(a.actions) do
        if type(action) ~= "string" then error("the LLM's actions must be strings") end
      end
      return a
    end)

    local summary = ("[%s] %s: likely cause: %s. Recommended: %s"):format(
      analysis.severity, service, analysis.root_cause, table.concat(analysis.actions, "; "))
    ctx.step.run("post-summary", function()
      -- step_key is the same on every attempt and replay: the chat can drop repeats.
      return http.post_json(env.CHAT_WEBHOOK, { text = summary, service = service, key = ctx.step_key })
    end)
    return { service = service, root_cause = analysis.root_cause, severity = analysis.severity,
             actions = analysis.actions }
  end,
}
