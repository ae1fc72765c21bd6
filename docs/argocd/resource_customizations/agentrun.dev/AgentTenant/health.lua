-- Argo CD health of an agentrun.dev/v1alpha1 AgentTenant (read from .status, which the
-- agentrun operator writes): Degraded when its spec cannot be enforced (Accepted=False: its
-- runs are rejected), Suspended while a window budget is used up (BudgetExhausted=True: new
-- runs wait for the next window or end, per spec.whenExhausted), Progressing until the operator
-- has read the current generation, Healthy otherwise.
local hs = {}
local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the agentrun operator to read the tenant"
  return hs
end
local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the agentrun operator to read generation " .. tostring(generation)
  return hs
end
local accepted = nil
local exhausted = nil
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Accepted" then
      accepted = condition
    elseif condition.type == "BudgetExhausted" then
      exhausted = condition
    end
  end
end
if accepted ~= nil and accepted.status == "False" then
  hs.status = "Degraded"
  hs.message = accepted.message or accepted.reason
  return hs
end
if exhausted ~= nil and exhausted.status == "True" then
  hs.status = "Suspended"
  hs.message = exhausted.message or exhausted.reason
  return hs
end
hs.status = "Healthy"
hs.message = tostring(status.activeRuns or 0) .. " active, " .. tostring(status.queuedRuns or 0) ..
  " queued runs"
return hs
