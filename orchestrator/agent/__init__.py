"""The agent server: the store and the runbook served over the Model Context Protocol (server),
and the child process that runs a plan for it through the engine API (child).

May import: core, proc, store, kinds, plan, run, views, api.
"""
