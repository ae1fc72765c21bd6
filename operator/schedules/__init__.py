"""CronAgentRun: AgentRuns created on a cron schedule, with CronJob's semantics.

Inside: ``plan`` (the schedule in its time zone and the planning rule: start, cancel and start,
skip or wait, and the history rule; pure), ``spec`` (``CronAgentRun.spec`` checked, and the
manifest of a scheduled run; pure), ``status`` (its runs as read back and the ``.status`` body;
pure), ``store`` (its API calls), ``memory`` (the schedules known, their wake-ups and
objects as last seen, bounded), ``turns`` (the schedules due, waiting for a place, the
tenants in turn and the namespaces inside each), ``controller`` (the loop: create, cancel,
prune, write).

No other kind imports schedules; the handlers and the wiring import its modules directly.
"""
