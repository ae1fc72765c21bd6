-- Argo CD health of an agentrun.dev/v1alpha1 Agent (read from its Ready condition, which the
-- agentrun operator writes): Healthy when its AgentModel and every tool exist, Degraded with
-- the reason when not (runs of it would end invalid_spec), Progressing until the operator has
-- checked the current generation.
local hs = {}
local status = obj.status
local generation = obj.metadata.generation
if status == nil or status.conditions == nil or
    (generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation)) then
  hs.status = "Progressing"
  hs.message = "Waiting for the agentrun operator to check the Agent"
  return hs
end
for _, condition in ipairs(status.conditions) do
  if condition.type == "Ready" then
    if condition.status == "True" then
      hs.status = "Healthy"
    else
      hs.status = "Degraded"
    end
    hs.message = condition.message or condition.reason
    return hs
  end
end
hs.status = "Progressing"
hs.message = "Waiting for the agentrun operator to check the Agent"
return hs
