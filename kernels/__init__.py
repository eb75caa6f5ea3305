"""Compute kernels (the top-level ``kernels/``, imported only as ``ringcomp.kernels``); they
never know about MPI."""

if __name__ != "ringcomp.kernels":  # one name per kernel: from the checkout's root, Python
    # would also find this folder as a package named ``kernels`` (and a PyPI package has it)
    raise ImportError(f"the kernels are imported as ringcomp.kernels, not as {__name__!r}")

from ringcomp.kernels.reduce import REDUCE_OPS, reduce_into, reduce_pair_into

__all__ = ["REDUCE_OPS", "reduce_into", "reduce_pair_into"]
