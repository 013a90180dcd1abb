"""The todo store: its tables, versions and invariants (schema), every read and write of it
(db), the typed rows that leave it (rows), the run lock (lock), whether a run's orchestrator
still lives (liveness), and the digest that says a plan is finished without loading it
(finished).

May import: core, proc.
"""
