"""Admission: a created AgentRun until it is admitted (or ends unadmitted), and its ledger slot
until it is settled.

Inside: ``config`` (spec + AgentModel + tenant policy → ``RunConfig``; a first call's worst
case; pure), ``lookup`` (``RunConfigs``: the config built with its AgentModel and
AgentToolServers looked up), ``queue`` (``QueueBoard``: the queues as last pumped, and kicks),
``pump`` (per-tenant FIFO queues, admitting from the head), ``rebinding`` (a queued run
belongs to the tenant its namespace binds now; pure), ``queuestatus`` (the status and
Events of runs that wait or end unadmitted), ``settlement`` (closing an ended run's ledger
entry), ``sweep`` (the periodic ledger repairs and AgentTenant status writes), ``storage``
(the event-stream bytes each tenant's runs take, checked at admission).

No other kind imports admission; the handlers and the wiring import its modules directly.
"""
