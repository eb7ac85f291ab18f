-- /etc/moonloop/moonloop.conf.lua: the configuration of moonloop.service.
-- Every key is described in docs/operations.md; flags and MOONLOOP_*
-- variables override them. Secrets do not go here: put them in
-- /etc/moonloop/environment (KEY=VALUE lines, mode 0600), and name the
-- variables the skills may read in `env` below.
return {
  db = "/var/lib/moonloop/moonloop.db",
  workspace = "/var/lib/moonloop/skills",
  -- Loopback only. To listen on another address, set MOONLOOP_TOKEN in
  -- /etc/moonloop/environment first: without a token the engine refuses.
  listen = "127.0.0.1:8288",
  durability = "full",
  -- llm = { base_url = "http://127.0.0.1:11434/v1", model = "llama3", api_key_env = "LLM_API_KEY" },
  -- env = { "METRICS_URL", "SLACK_WEBHOOK" },
  -- deployers = { "update-skill" },
}
