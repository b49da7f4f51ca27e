"""The cost model: GPU kernel tables and their fit, a layer's time, ring collectives, and FP8's."""
