-- Argo CD health of an agentrun.dev/v1alpha1 AgentEval (read from its phase and its Passed
-- condition, which the agentrun operator writes): Healthy when every case of the current round
-- passed, Degraded with the failed cases (or the invalid field) as soon as one failed,
-- Progressing while the round's runs are going or the operator has not started the current
-- generation's round. An Argo CD sync that waits for health therefore waits for the verdict.
local hs = {}
local status = obj.status
local generation = obj.metadata.generation
if status == nil or status.phase == nil or
    (generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation)) then
  hs.status = "Progressing"
  hs.message = "Waiting for the agentrun operator to start the evaluation"
  return hs
end
local passed = nil
if status.conditions ~= nil then
  for _, condition in ipairs(status.conditions) do
    if condition.type == "Passed" then
      passed = condition
    end
  end
end
if status.phase == "Succeeded" then
  hs.status = "Healthy"
elseif status.phase == "Failed" then
  hs.status = "Degraded"
else
  hs.status = "Progressing"
  local graded = 0
  local total = 0
  if status.summary ~= nil then
    graded = (status.summary.passed or 0) + (status.summary.failed or 0)
    total = status.summary.total or 0
  end
  hs.message = "Evaluating: " .. graded .. " of " .. total .. " cases graded"
  return hs
end
if passed ~= nil then
  hs.message = passed.message or passed.reason
else
  hs.message = status.phase
end
return hs
