"""Measuring this machine for the simulator: the runtime's host times and links, and a GPU's kernel tables."""
