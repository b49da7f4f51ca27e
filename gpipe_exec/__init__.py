"""gpipe_exec: run the simulator's schedules for real on torch.distributed and measure them."""
