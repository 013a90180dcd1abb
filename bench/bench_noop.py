"""The task that `bench_engine.py` runs: does nothing, so what is timed is the engine."""


def noop() -> None:
    return None
