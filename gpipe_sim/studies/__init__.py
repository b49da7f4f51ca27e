"""Studies on the core: the GPipe paper, the largest model that fits, vTrain's A100 runs, the benchmark; their commands."""
