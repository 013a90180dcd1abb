"""What is concluded from `orch.bench` results, `analyze.compare`: the result document's
models, the speculation arithmetic (tau, k, alpha), matching levels, verdicts and their
Markdown, and the benchmark's figures (plots)."""
