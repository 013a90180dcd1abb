"""Running a plan: the loop (loop: execute, and the Runner that starts ready tasks in plan
order, up to `jobs` at once), one task from `when` to its record (attempt), its params and
preconditions (checks), what tasks hold (leases: pool members and named units while they run,
resources left running for later tasks), compensations and `finally` tasks (mending), what to
run and why (selection), what is stale (stale), approval gates (approvals), tasks added to the
store (todos), paths built from findings (confine), the run's log (runlog), and the dry run
that explains all of it (dryrun).

May import: core, proc, store, kinds, plan.
"""
