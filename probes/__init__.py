"""Read-only views of the host (systemd units, NVML GPUs, processes and ports).

Beside the engine, not in it: `orchestrator/` knows nothing of GPUs or systemd. Probes return
plain dataclasses, import their heavy libraries lazily, and turn "not available here" into a
typed outcome instead of an exception.
"""
