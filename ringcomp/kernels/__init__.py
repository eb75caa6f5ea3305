"""Compute kernels (installed as ``ringcomp.kernels``); they never know about MPI."""

from ringcomp.kernels.reduce import REDUCE_OPS, reduce_into, reduce_pair_into

__all__ = ["REDUCE_OPS", "reduce_into", "reduce_pair_into"]
