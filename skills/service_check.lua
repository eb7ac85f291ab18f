-- service_check.lua: a first loop. Fetch service metrics, flag the
-- unhealthy services, wait a moment and look again, then post a summary to
-- chat. Every step is checkpointed: kill the engine at any point and the
-- run resumes from its last completed step, without posting twice.
return {
  id = "service-check",
  description = "Fetch service metrics, confirm unhealthy services, post a summary to chat",
  retries = 3,
  backoff = "300ms",
  run = function(ctx)
    local metrics = ctx.step.run("fetch-metrics", function()
      return http.get_json(env.METRICS_URL .. "/metrics")
    end)

    local suspects = {}
    for _, s in ipairs(metrics.services) do
      if s.error_rate > 0.05 or s.latency_ms > 500 then
        suspects[#suspects + 1] = s.name
      end
    end
    log.info(("%d of %d services look unhealthy"):format(#suspects, #metrics.services))

    -- A durable sleep: it survives a restart and ends on its original schedule.
    ctx.step.sleep("settle", "2s")

    local confirmed = ctx.step.run("confirm", function()
      local again = http.get_json(env.METRICS_URL .. "/metrics")
      local bad = {}
      for _, s in ipairs(again.services) do
        for _, name in ipairs(suspects) do
          if s.name == name and (s.error_rate > 0.05 or s.latency_ms > 500) then
            bad[#bad + 1] = name
          end
        end
      end
      return bad
    end)

    local text = #confirmed == 0 and "all services healthy"
      or ("unhealthy: " .. table.concat(confirmed, ", "))
    ctx.step.run("post-summary", function()
      -- ctx.step_key is stable across retries and replays: a chat service
      -- can use it to drop duplicates.
      return http.post_json(env.CHAT_WEBHOOK, { text = text, key = ctx.step_key })
    end)
    return { unhealthy = confirmed, checked = #metrics.services }
  end,
}
