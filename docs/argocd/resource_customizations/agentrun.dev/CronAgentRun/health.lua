-- Argo CD health of an agentrun.dev/v1alpha1 CronAgentRun (read from its spec.suspend and the
-- Ready condition the agentrun operator writes): Healthy while it schedules runs, Suspended
-- while spec.suspend holds new runs back, Degraded with the message when its schedule, time
-- zone or run template cannot be used (no runs are created), Progressing until the operator
-- has read the current generation. The runs it creates have health of their own.
local hs = {}
local status = obj.status
local generation = obj.metadata.generation
if status == nil or status.conditions == nil or
    (generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation)) then
  hs.status = "Progressing"
  hs.message = "Waiting for the agentrun operator to read the CronAgentRun"
  return hs
end
for _, condition in ipairs(status.conditions) do
  if condition.type == "Ready" then
    if condition.status ~= "True" then
      hs.status = "Degraded"
      hs.message = condition.message or condition.reason
    elseif obj.spec ~= nil and obj.spec.suspend == true then
      hs.status = "Suspended"
      hs.message = "Suspended: spec.suspend holds new runs back"
    else
      hs.status = "Healthy"
      hs.message = condition.message or condition.reason
    end
    return hs
  end
end
hs.status = "Progressing"
hs.message = "Waiting for the agentrun operator to read the CronAgentRun"
return hs
