-- update_skill_test.lua: tests of update_skill.lua (run: moonloop test skills/).
-- skills.get and skills.deploy are not reachable in tests: "read-current" and
-- "deploy" are mocked; the LLM is mocked and skills.check runs for real.
local t = test.skill("update_skill.lua")

local CURRENT = [[
local THRESHOLDS = { latency_ms = 500 }  -- p95 latency
return {
  id = "health-check",
  run = function(ctx) return { limit = THRESHOLDS.latency_ms } end,
}
]]
local NEW = CURRENT:gsub("500 }  %-%- p95 latency", "800 }  -- p95 latency (raised by the weekly review)")
local OLD_VERSION = ("a"):rep(64)
local NEW_VERSION = ("b"):rep(64)
local INPUT = { skill = "health-check", reason = "5 of 9 incidents were false positives",
                suggestion = "raise the latency threshold from 500 ms to 800 ms" }

local function setup(c, answer)
  c:mock("read-current", { source = CURRENT, version = OLD_VERSION })
  c:llm(answer)
  c:mock("deploy", { file = "skills/health_check.lua", version = NEW_VERSION })
end

t:case("a fenced proposal is unfenced, checked and deployed", function(c)
  setup(c, "```lua\n" .. NEW .. "\n```")
  local out = c:run(INPUT)
  c:steps({ "read-current", "propose", "check", "deploy" })
  c:eq(c:step("propose").output, NEW)  -- the file, without its fences
  c:eq(c:step("check").output, { ok = true, id = "health-check" })
  c:eq(out, { skill = "health-check", old_version = OLD_VERSION, new_version = NEW_VERSION,
              file = "skills/health_check.lua" })
  c:eq(c:logs()[1].msg, "deployed health-check: aaaaaaaaaaaa -> bbbbbbbbbbbb")
  -- The LLM was given the change, the reason and the current file.
  local prompt = c:requests()[1].json.messages[2].content
  c:ok(prompt:find(INPUT.suggestion, 1, true) and prompt:find(INPUT.reason, 1, true), prompt)
  c:ok(prompt:find(CURRENT, 1, true), prompt)
end)

t:case("prose around the fences is dropped", function(c)
  setup(c, "Here is the updated file:\n\n```\n" .. NEW .. "```\nIt raises the latency threshold.")
  c:run(INPUT)
  c:eq(c:step("propose").output, NEW:sub(1, -2))  -- the newline before the closing fence goes too
  c:eq(c:status(), "completed")
end)

t:case("an answer without fences is taken as it is", function(c)
  setup(c, NEW)
  c:run(INPUT)
  c:eq(c:step("propose").output, NEW)
  c:steps({ "read-current", "propose", "check", "deploy" })
end)

t:case("a proposal that fails check fails the run before deploying", function(c)
  setup(c, "```lua\nreturn {\n  id = \"health-check\",\n  run = function(ctx) return 1\n}\n```")
  local out = c:run(INPUT)
  c:eq(out, nil)
  c:eq(c:status(), "failed")
  c:err("the proposed version does not pass check: ")
  c:steps({ "read-current", "propose", "check" })
  c:eq(c:step("check").output.ok, false)
end)

t:case("a proposal declaring another id fails the run before deploying", function(c)
  setup(c, (NEW:gsub('id = "health%-check"', 'id = "health-check-v2"')))
  c:run(INPUT)
  c:err("the proposed version declares id 'health-check-v2', not 'health-check'")
  c:steps({ "read-current", "propose", "check" })
end)

t:case("a skill with no live version fails at once", function(c)
  -- The real body: skills.get answers nil and a message in tests, as for an unknown skill.
  c:run({ skill = "no-such-skill", suggestion = "x" })
  c:err("no live skill 'no-such-skill'")
  c:eq(c:step("read-current").attempts, 1)  -- fatal: not retried
  c:steps({ "read-current" })
end)

t:case("a refused deploy is retried once, then fails the run", function(c)
  setup(c, NEW)
  c:mock_error("deploy", "skills.deploy: skill 'update-skill' is not allowed to deploy")
  c:run(INPUT)
  c:err("step 'deploy' failed: ")
  c:err("is not allowed to deploy")
  c:eq(c:step("deploy").attempts, 2)  -- retries = 1
end)

return t
