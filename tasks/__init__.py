"""orch's task library: the field's knowledge, as task kinds registered like any plugin's
(pyproject.toml's `orch.kinds`, `orch.checks`, `orch.pools`, `orch.progress`); the engine
never imports it.

Four packages by concern, each importing only those before it (tests/test_layers.py):

- `host`: what a GPU host has and does: systemd units, GPUs (NVML), processes, ports, disk,
  Python packages.
- `serving`: an inference server as a resource: launch and stop, and one adapter per serving
  engine (`serving.engines`) saying everything orch knows of that engine.
- `analysis`: the `orch.bench` result document and what is concluded from it: speculation
  arithmetic, level matching, verdicts, their Markdown and figures (`analyze.compare`).
- `benchmark`: the load generator (`bench.serve`): prompts, requests through the engine's
  adapter, windows and their judging, the client's processes; it writes what `analysis` reads.
"""
