"""The cost model: GPU kernel tables and their fit, a layer's time, and FP8's."""
