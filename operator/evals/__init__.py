"""AgentEval: graded suites of runs of an Agent.

Inside: ``spec`` (``AgentEval.spec`` as frozen values, pure), ``grading`` (a finished run
against a case's expectations, pure), ``status`` (rounds, the deterministic names and
manifests of case runs, the ``.status`` body; pure), ``news`` (the counts and Events a written
status records, each told once), ``checked`` (a suite's spec checked once per generation,
remembered within a memory bound), ``store`` (its API calls: the suite, its Agents, its runs,
its status), ``controller`` (one reconcile at a time: create, grade, delete, write).

No other kind imports evals; the handlers and the wiring import its modules directly.
"""
