"""The scenario specification: schema, units, presets, model layer tables and their costs."""
