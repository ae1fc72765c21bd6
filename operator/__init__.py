"""The agentrun operator (kopf): admission, dispatch of turns, status projection, deadlines.

Layers: ``admission`` and ``status`` are pure (spec + AgentModel → RunConfig; events → status
body); ``statuswriter`` coalesces status patches; ``dispatch`` consumes committed run events and
publishes the next TurnRequest or ends the run; ``handlers`` are the kopf entry points; ``main``
is process wiring. The operator never imports the worker.
"""
