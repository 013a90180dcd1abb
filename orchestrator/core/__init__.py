"""The vocabulary every layer shares: errors and exit codes, task statuses, findings,
durations, sizes, the masking of secrets, terminal text, guard roles, file checks.

May import: nothing of orch (the standard library only), so that any layer can use it and
`orch status` pays for none of the heavy modules.
"""
