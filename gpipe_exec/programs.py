"""Former home of the split-backward transform, now in gpipe_sim (schedule/split.py, plan/rescheduled.py): names kept for two callers until they move."""

from gpipe_sim.plan.rescheduled import with_schedule
from gpipe_sim.schedule.split import WeightPlacement, pass_orders, split_backward

__all__ = ["WeightPlacement", "pass_orders", "split_backward", "with_schedule"]
