"""Running a plan: the loop (loop: ready tasks, attempts, guards), what to run and why
(selection), what is stale (stale), resources held across tasks (leases), approval gates
(approvals), tasks added to the store (todos), paths built from findings (confine), the run's
log (runlog), and the dry run that explains all of it (dryrun).

May import: core, proc, store, kinds, plan.
"""
