"""Measurement: the aligned clock, saved-tensor and device-memory meters, the host allocator."""
