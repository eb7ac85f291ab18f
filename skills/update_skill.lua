-- update_skill.lua: rewrite a skill as asked. It reads the skill's current
-- source, asks the LLM for a new version that makes the requested change,
-- checks it as `moonloop check` does, and deploys it: the file is written
-- into the workspace and the sidecar makes it live. Runs of the old version
-- finish on it; new runs start on the new one.
--
-- Deploying needs this skill's id in the configuration's `deployers`.

-- Models often wrap code in ``` fences: keep what is inside the first
-- opening fence and the last closing one (the file may hold fences itself).
local function unfence(text)
  return text:match("```%w*[ \t]*\r?\n(.*)\n```") or text
end

return {
  id = "update-skill",
  description = "Ask the LLM for a new version of a skill, check it, and deploy it",
  retries = 1,
  run = function(ctx)
    local target = ctx.input.skill
    local current = ctx.step.run("read-current", function()
      local s, err = skills.get(target)
      if not s or not s.source then error(fatal("no live skill '" .. target .. "': " .. tostring(err))) end
      return { source = s.source, version = s.version }
    end)

    local proposal = ctx.step.run("propose", function()
      local answer = llm.chat{
        system = "You edit moonloop skill files. Answer with the complete new Lua file only.",
        prompt = "Change requested: " .. tostring(ctx.input.suggestion) .. "\nReason: " .. tostring(ctx.input.reason)
          .. "\nSkill file:\n" .. current.source,
      }
      return unfence(answer.text)
    end)

    local check = ctx.step.run("check", function()
      return skills.check(proposal, target .. ".lua")
    end)
    if not check.ok then
      error(fatal("the proposed version does not pass check: " .. tostring(check.error)))
    end
    if check.id ~= target then
      error(fatal(("the proposed version declares id '%s', not '%s'"):format(tostring(check.id), target)))
    end

    local deployed = ctx.step.run("deploy", function()
      return skills.deploy(target, proposal)
    end)
    log.info(("deployed %s: %s -> %s"):format(target, current.version:sub(1, 12), deployed.version:sub(1, 12)))
    return { skill = target, old_version = current.version, new_version = deployed.version, file = deployed.file }
  end,
}
