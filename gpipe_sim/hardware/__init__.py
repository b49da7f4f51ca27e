"""The hardware a scenario runs on: accelerators, links, hosts, their kernel tables and the vendor presets."""
