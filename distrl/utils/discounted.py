"""Discounted sums over the time dimension of a ``[T, ...]`` tensor, as one batched operation (no
Python loop over T): V-trace's recursion (:mod:`distrl.learning.losses.vtrace`) and the intrinsic
rewards' returns (:mod:`distrl.intrinsic`) use it."""

from __future__ import annotations

import torch

# The most elements T x T x B that :func:`reverse_discounted_sum` puts in its matrix of products
# (64 MiB in fp32): T=32 with B up to 16,384, T=80 with B up to 2,621. Above, it loops over T.
MATRIX_ELEMENTS = 2**24


def reverse_discounted_sum(deltas: torch.Tensor, factors: torch.Tensor,
                           max_elements: int = MATRIX_ELEMENTS) -> torch.Tensor:
    """The backward recursion ``x_s = delta_s + f_s x_{s+1}`` from ``x_T = 0``, for every ``s``:
    ``x_s = sum_{t >= s} (prod_{i=s}^{t-1} f_i) delta_t`` (Espeholt et al. 2018, eq. 1 and Remark 1,
    with ``f_i = gamma_i c_i`` and ``delta_t = delta_t V``; also the discounted return with
    ``delta = r``, ``f = gamma``).

    Computed as one batched product with the upper-triangular ``T x T`` matrix of the products of
    ``f``: a dozen tensor operations whatever ``T``, where a loop over ``t`` launches several per
    step, and a GPU learner is bounded by those launches (docs/lab/benchmarks.md: the learner 1.21x on
    an H200). The sums' rounding differs from the loop's by about float32's epsilon. When
    ``T x T x (the rest)`` would exceed ``max_elements`` it loops.

    Args:
        deltas: ``[T, ...]`` the terms (float).
        factors: ``[T, ...]`` the factors ``f_s``, same shape and dtype.
        max_elements: the largest ``T x deltas.numel()`` computed with the matrix.

    Returns:
        ``[T, ...]`` ``x_s``, the dtype of ``deltas``.
    """
    steps = deltas.shape[0]
    if steps * deltas.numel() > max_elements:
        acc = torch.zeros_like(deltas[0])
        sums = torch.empty_like(deltas)
        for t in range(steps - 1, -1, -1):
            acc = deltas[t] + factors[t] * acc
            sums[t] = acc
        return sums
    index = torch.arange(steps, device=deltas.device).view(steps, *[1] * deltas.dim())  # s, as [T, 1, ...]
    later = index < index.transpose(0, 1)  # [s, t]: t > s
    previous = torch.cat([torch.ones_like(factors[:1]), factors[:-1]])  # f_{t-1}, 1 at t = 0
    # weights[s, t] = prod_{i=s}^{t-1} f_i for t >= s (1 at t = s), 0 for t < s
    weights = torch.where(later, previous.unsqueeze(0), 1.0).cumprod(dim=1) * (index <= index.transpose(0, 1))
    return (weights * deltas.unsqueeze(0)).sum(dim=1)
