-- review_skill_performance.lua: the weekly review. It reads the last seven
-- days of incident triages from the run history, computes their success
-- rate and average duration, fetches what became of the incidents
-- (confirmed, false positives, acted on), and asks the LLM whether the
-- health check's thresholds or classification should change. If so, it
-- invokes update-skill, which rewrites the skill and deploys it.
--
-- Configuration (env): OUTCOMES_URL; REVIEW_CRON (default Mondays at 09:00),
-- granted like the other (left unset, it reads as nil).

-- The skills this review may have rewritten: whatever the LLM names, no other.
local TUNABLE = { ["health-check"] = true }

return {
  id = "review-skill-performance",
  description = "Weekly: measure incident triage, ask whether the health check should change, update it",
  triggers = { { cron = env.REVIEW_CRON or "0 9 * * MON" } },
  retries = 2,
  run = function(ctx)
    local stats = ctx.step.run("triage-stats", function()
      local total, completed, failed, seconds = 0, 0, 0, 0
      for _, r in ipairs(runs.list{ skill = "incident-triage", since = "7d", limit = 10000 }) do
        -- Runs still going have no outcome yet: they do not count.
        if r.status == "completed" or r.status == "failed" then total = total + 1 end
        if r.status == "completed" then
          completed = completed + 1
          seconds = seconds + (time.parse(r.ended_at) - time.parse(r.started_at))
        elseif r.status == "failed" then
          failed = failed + 1
        end
      end
      return { total = total, completed = completed, failed = failed,
               success_rate = total > 0 and completed / total or json.null,
               avg_duration_s = completed > 0 and math.floor(seconds / completed * 1000 + 0.5) / 1000 or json.null }
    end)

    local outcomes = ctx.step.run("fetch-outcomes", function()
      return http.get_json(env.OUTCOMES_URL .. "/outcomes?since=7d")
    end)

    local advice = ctx.step.run("ask-for-advice", function()
      local a = llm.chat{
        system = "You review an automated incident pipeline. Answer only JSON.",
        prompt = "Review the week. Should the health check's thresholds or classification change? "
          .. "Answer {\"change\": true|false, \"skill\": \"health-check\", \"reason\": string, "
          .. "\"suggestion\": string}.\nTRIAGE: " .. json.encode(stats) .. "\nOUTCOMES: " .. json.encode(outcomes),
        json = true,
      }.json
      if type(a) ~= "table" or type(a.change) ~= "boolean" then
        error("the LLM's review has no 'change' verdict")
      end
      return a
    end)
    log.info(advice.change and ("change suggested: " .. tostring(advice.suggestion)) or "no change suggested")
    if not advice.change then
      return { stats = stats, outcomes = outcomes, changed = false }
    end

    local target = advice.skill or "health-check"
    if not TUNABLE[target] then
      log.warn(("the LLM asked to rewrite '%s', which this review may not change"):format(tostring(target)))
      return { stats = stats, outcomes = outcomes, changed = false }
    end
    local update = ctx.step.invoke("update", {
      skill = "update-skill",
      data = { skill = target, reason = advice.reason, suggestion = advice.suggestion },
      timeout = "1h",
    })
    return { stats = stats, outcomes = outcomes, changed = true, update = update }
  end,
}
