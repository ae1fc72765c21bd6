-- Argo CD health of an agentrun.dev/v1alpha1 AgentRun (read from .status, which the agentrun
-- operator writes): Pending, Queued and Running are Progressing; AwaitingApproval is Suspended
-- (a person must approve or deny a tool call); Succeeded is Healthy; Failed and Cancelled are
-- Degraded, with the terminal reason and the operator's message.
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
    hs.message = "completed in " .. tostring(status.usage.steps or 0) .. " steps, " ..
      status.usage.costUSD .. " USD"
  end
elseif phase == "Failed" or phase == "Cancelled" then
  hs.status = "Degraded"
  hs.message = (status.terminalReason or string.lower(phase)) .. ": " .. message
elseif phase == "AwaitingApproval" then
  hs.status = "Suspended"
  local pending = status.pendingApproval
  if pending ~= nil and pending.tool ~= nil then
    hs.message = "Waiting for a person to approve or deny a call of " .. pending.tool
  else
    hs.message = "Waiting for a person to approve or deny a tool call"
  end
elseif phase == "Queued" then
  hs.status = "Progressing"
  hs.message = message
else
  hs.status = "Progressing"
  if status.usage ~= nil and status.usage.steps ~= nil then
    hs.message = phase .. ": " .. tostring(status.usage.steps) .. " steps so far"
  else
    hs.message = phase
  end
end
return hs
