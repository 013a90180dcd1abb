"""Processes: the /proc toolkit (procfs), starting a task's commands in their own group with
a capped log (spawn), a task's output masked into its log (tasklog), what a `python` task
prints routed there per thread (printed), keeping everything they start inside a jail
(containment), and seeing when they stall (stalls). Knows nothing of plans or the store.

May import: core.
"""
