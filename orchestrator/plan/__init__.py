"""The plan language: the YAML source with line numbers (yamlsource), the validated model of
tasks, guards and checks (model), `${...}` templating and `when` (templating), and which params
may name code that runs (trust).

May import: core, proc, store, kinds.
"""
