"""What every part of a scenario is written with: field kinds, units, limits, reading files, one-line errors."""
