-- Argo CD health of an agentrun.dev/v1alpha1 AgentRun (read from .status, which the agentrun
-- operator writes): Pending, Queued and Running are Progressing; AwaitingApproval is Suspended
-- (a person must approve or deny a tool call; the message names which of the turn's held calls
-- waits and how many were held, e.g. "call 2 of 3 held for approval: calculate (1 decided)");
-- Succeeded is Healthy; Failed and Cancelled are Degraded, with the terminal reason and the
-- operator's message.
local function steps(n)
  if n == 1 then
    return "1 step"
  end
  return tostring(n) .. " steps"
end
local hs = {}
local status = obj.status
if status == nil or status.phase == nil or status.phase == "Pending" then
  hs.status = "Progressing"
  hs.message = "Waiting for the agentrun operator to admit the run"
  return hs
end
local phase = status.phase
local message = status.message or ""
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = "completed"
  if status.usage ~= nil and status.usage.costUSD ~= nil then
    hs.message = "completed in " .. steps(status.usage.steps or 0) .. ", " ..
      status.usage.costUSD .. " USD"
  end
elseif phase == "Failed" or phase == "Cancelled" then
  hs.status = "Degraded"
  hs.message = (status.terminalReason or string.lower(phase)) .. ": " .. message
elseif phase == "AwaitingApproval" then
  hs.status = "Suspended"
  local pending = status.pendingApproval
  if pending ~= nil and pending.tool ~= nil then
    -- call and of: the waiting call's position among the turn's held calls and their number;
    -- heldCalls: each held call with its decision so far (pending, approved, denied)
    local held = pending.heldCalls or {}
    local total = pending.of or #held
    if total > 0 then
      local decided = 0
      for _, call in ipairs(held) do
        if call.decision == "approved" or call.decision == "denied" then
          decided = decided + 1
        end
      end
      local position = pending.call or (decided + 1)
      hs.message = "Waiting for a person to approve or deny call " .. tostring(position) ..
        " of " .. tostring(total) .. " held for approval: " .. pending.tool
      if decided > 0 then
        hs.message = hs.message .. " (" .. tostring(decided) .. " decided)"
      end
    else
      hs.message = "Waiting for a person to approve or deny a call of " .. pending.tool
    end
  else
    hs.message = "Waiting for a person to approve or deny a tool call"
  end
elseif phase == "Queued" then
  hs.status = "Progressing"
  hs.message = message
else
  hs.status = "Progressing"
  if status.usage ~= nil and status.usage.steps ~= nil then
    hs.message = phase .. ": " .. steps(status.usage.steps) .. " so far"
  else
    hs.message = phase
  end
end
return hs
