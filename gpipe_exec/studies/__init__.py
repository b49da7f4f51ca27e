"""Studies on real runs: calibration, validation against the simulator, accuracy, benchmarks."""
