"""The per-layer profiler's parts: options, timing, memory figures and the layer table (facade: gpipe_exec.profile)."""
