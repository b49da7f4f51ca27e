"""The planner: every split of N devices searched (space), pruned by bounds, ranked (search), reported, and its command."""
