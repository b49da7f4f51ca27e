"""Studies built on the core: sweeps, largest-model search, the paper's tables, plots, reports, benchmarks."""
