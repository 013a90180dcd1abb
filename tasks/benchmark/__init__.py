"""The load generator, `bench.serve`: prompts, one streaming request through the engine's
adapter, windows until they agree and their judging, the client over several processes, and
the `orch.bench` document it writes (read by tasks.analysis)."""
