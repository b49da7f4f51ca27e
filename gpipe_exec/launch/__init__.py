"""Starting ranks: spawned processes on this machine, or torchrun."""
