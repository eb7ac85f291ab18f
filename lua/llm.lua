-- llm.lua: llm.chat against an OpenAI-compatible endpoint.
--
--   llm.chat{prompt = "..."} or llm.chat{messages = {{role=, content=}, ...}}
--     options: model, json (ask for and parse a JSON answer), temperature,
--     max_tokens, timeout, system (a system message put first)
--   returns {text=, json=, usage = {prompt_tokens=, completion_tokens=, total_tokens=}, model=}
--
-- The endpoint, model and key come from the configuration (llm.base_url,
-- llm.model, and the variable named by llm.api_key_env). Answers 429 and
-- 5xx, and transport failures that a moment may cure (refused, reset,
-- timed out, a name not found), are retried here (up to 4 times, each
-- retry a warn line in the step's log), honouring Retry-After (at most
-- 120 s), before the step's own retries come into play. An answer over the
-- size limit, or the step's timeout, ends the call at once. Token usage is added to the step's record. Call
-- it inside a step body: the answer is then checkpointed like any step
-- result, so a replay never pays for the same call twice.

local core = ...
local M = {}

local OP = core.OP
local yield = coroutine.yield
local type, tostring, error, ipairs, pcall, tonumber = type, tostring, error, ipairs, pcall, tonumber
local encode = core.encode
-- The provider's answer is text from outside: bounded (core.decode).
local function decode(s) return core.decode(s, true) end
local user_error = require("run").user_error -- errors at the skill's line
local LLM_PATH = require("api").llm_path

local MAX_RETRIES = 4
-- The transport failures (httpc.h's reasons) worth another try.
local TRANSIENT = { timeout = true, connect = true, dns = true, network = true }

local function excerpt(s)
  s = tostring(s or "")
  if #s > 300 then s = s:sub(1, 300) .. "..." end
  return s
end

-- Delay before retry n: Retry-After when the endpoint sent one.
local function retry_delay(resp, n)
  local ra = resp and resp.headers and resp.headers["retry-after"]
  if ra then
    local secs = tonumber(ra)
    if not secs then
      local at = core.http_date(ra)
      if at then secs = (at - core.now()) / 1000 end
    end
    if secs then return math.max(0, math.min(secs, 120)) * 1000 end
  end
  return math.min(1000 * 2 ^ (n - 1), 30000) * (0.5 + core.random() / 2)
end

-- Answers wrapped in ``` fences (models do that) are unwrapped before parsing.
local function unfence(text)
  local inner = text:match("^%s*```[%w_-]*%s*\n(.-)\n?```%s*$")
  return inner or text
end

local function messages_of(req)
  local msgs = {}
  if req.system ~= nil then
    if type(req.system) ~= "string" then user_error("llm.chat: 'system' must be a string") end
    msgs[#msgs + 1] = { role = "system", content = req.system }
  end
  if req.messages ~= nil then
    if type(req.messages) ~= "table" or #req.messages == 0 then
      user_error("llm.chat: 'messages' must be a non-empty list of {role=, content=}")
    end
    for i, m in ipairs(req.messages) do
      if type(m) ~= "table" or type(m.role) ~= "string" or type(m.content) ~= "string" then
        user_error(("llm.chat: message %d needs a 'role' and a 'content' string"):format(i))
      end
      msgs[#msgs + 1] = { role = m.role, content = m.content }
    end
  elseif type(req.prompt) == "string" then
    msgs[#msgs + 1] = { role = "user", content = req.prompt }
  else
    user_error("llm.chat: give 'prompt' (a string) or 'messages' (a list)")
  end
  return core.json.array(msgs)
end

-- config.c's default llm.base_url: an Ollama server on this machine.
local DEFAULT_BASE_URL = "http://127.0.0.1:11434/v1"
-- Failures where no server answered at the endpoint: a hint names the setting.
local UNREACHABLE = { connect = true, dns = true }

-- Where the endpoint comes from, for an error that could not reach it.
local function endpoint_hint(base_url)
  if base_url == DEFAULT_BASE_URL then
    return ("; the endpoint is the default llm.base_url, %s (a local Ollama): set llm = "
      .. "{ base_url = ..., model = ... } in moonloop.conf.lua"):format(base_url)
  end
  return ("; the endpoint is llm.base_url in moonloop.conf.lua (%s)"):format(base_url)
end

function M.chat(req)
  if type(req) ~= "table" then user_error("llm.chat expects a table {prompt= or messages=, json=, model=}") end
  local cfg = core.llm_settings or { base_url = DEFAULT_BASE_URL, model = "llama3" }
  local body = {
    model = req.model or cfg.model, messages = messages_of(req),
    temperature = req.temperature, max_tokens = req.max_tokens,
  }
  if req.json then body.response_format = { type = "json_object" } end
  local url = cfg.base_url:gsub("/+$", "") .. LLM_PATH
  local headers = { ["Content-Type"] = "application/json", Accept = "application/json" }
  if cfg.api_key and cfg.api_key ~= "" then headers.Authorization = "Bearer " .. cfg.api_key end
  local payload, err = encode(body, 0)
  if not payload then user_error("llm.chat: the request is not a JSON value: " .. err) end
  local n = 0
  while true do
    n = n + 1
    local resp, err, why = M.request{ method = "POST", url = url, headers = headers, body = payload,
                                      timeout = req.timeout or 120 }
    local retryable
    if resp then retryable = resp.status == 429 or resp.status >= 500
    else retryable = why == nil or TRANSIENT[why] end
    if why == "step_timeout" then
      user_error(("llm.chat: %s%s"):format(err, n > 1 and (" (after %d tries)"):format(n) or ""))
    elseif retryable and n <= MAX_RETRIES then
      -- Said in the trace (a log line of the step), so a slow step shows why:
      -- transport failures (refused, reset, timed out) are retried too,
      -- since a model server that restarts answers again a moment later.
      local delay = retry_delay(resp, n)
      if M.warn then
        M.warn(("llm.chat: POST %s %s; retry %d of %d in %.1fs%s"):format(url,
          resp and ("returned " .. resp.status) or ("failed: " .. tostring(err)), n, MAX_RETRIES, delay / 1000,
          not resp and UNREACHABLE[why] and endpoint_hint(cfg.base_url) or ""))
      end
      local _, late = yield(OP.DELAY, delay)
      if late then -- the step's time ran out while it waited
        user_error(("llm.chat: %s, waiting to try again after: %s"):format(late,
          resp and ("returned " .. resp.status) or tostring(err)))
      end
    elseif not resp then
      user_error(("llm.chat: %s%s%s"):format(err, n > 1 and (" (after %d tries)"):format(n) or "",
        UNREACHABLE[why] and endpoint_hint(cfg.base_url) or ""))
    elseif resp.status < 200 or resp.status > 299 then
      user_error(("llm.chat: POST %s returned %d: %s%s"):format(url, resp.status, excerpt(resp.body),
        n > 1 and (" (after %d tries)"):format(n) or ""))
    else
      local ok, data = pcall(decode, resp.body)
      local choice = ok and type(data) == "table" and type(data.choices) == "table" and data.choices[1]
      local text = choice and type(choice.message) == "table" and choice.message.content
      if type(text) ~= "string" then
        user_error(("llm.chat: the endpoint's answer has no choices[1].message.content: %s"):format(excerpt(resp.body)))
      end
      local usage = type(data.usage) == "table" and data.usage or nil
      if usage then
        core.step_usage(tonumber(usage.prompt_tokens) or 0, tonumber(usage.completion_tokens) or 0,
                        tonumber(usage.total_tokens) or 0)
      end
      local out = { text = text, usage = usage, model = data.model }
      if req.json then
        local jok, v = pcall(decode, unfence(text))
        if not jok then
          user_error(("llm.chat: the model's answer is not JSON (json = true): %s"):format(excerpt(text)))
        end
        out.json = v
      end
      return out
    end
  end
end

return M
