"""What task authors build on: the Task, Precondition and Pool base classes and the Context a
task runs with (task), the sections a kind adds to the report (sections), where kinds come
from (registry: built-ins, entry points, `module:Class`) and the built-in kinds (builtins).

May import: core, proc, store.
"""
