"""Scheduling: when and in what groups gradients are communicated (and compressed)."""

from ringcomp.sched.planners import PLANNERS, make_plan
from ringcomp.sched.timeline import Group, Problem, iteration_time, timeline

__all__ = ["PLANNERS", "Group", "Problem", "iteration_time", "make_plan", "timeline"]
