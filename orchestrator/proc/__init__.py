"""Processes: the /proc toolkit (procfs), starting a task's commands in their own group with
a capped log (spawn), keeping everything they start inside a jail (containment), and seeing
when they stall (stalls). Knows nothing of plans or the store.

May import: core.
"""
