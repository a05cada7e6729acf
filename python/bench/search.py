"""The largest size that fits (no torch): doubling from a start, then bisection,
within a number of probes. The child calls it with a probe that runs one step of
the workload under the memory budget and says whether it fitted."""


def largest_fitting(fits, start, limit, step, max_probes):
    """The largest ``n`` (a multiple of ``step``, at most ``limit``) with
    ``fits(n)`` true, assuming that fitting is monotone (what fits at ``n`` fits at
    anything smaller), found with at most ``max_probes`` calls: ``start``, then
    doubling while it fits, then bisection between the largest fit and the smallest
    failure seen. Returns ``(best, probes, exact)``: best is 0 when nothing probed
    fitted; probes lists ``[n, fitted]`` in order; exact says whether the answer
    is within ``step`` of the smallest failure (or is ``limit``), i.e. the probes
    were enough.

    ``fits`` may raise: the exception ends the search and propagates (the caller
    records it); an out-of-memory is ``False``, not an exception."""
    if step < 1 or start < step or limit < start or max_probes < 1:
        raise ValueError(f"bad search range: start {start}, limit {limit}, step {step}, max_probes {max_probes}")
    probes = []
    lo, hi = 0, None  # largest fit, smallest failure

    def probe(n):
        ok = bool(fits(n))
        probes.append([n, ok])
        return ok

    n = start
    while len(probes) < max_probes:
        if probe(n):
            lo = n
            if n >= limit:
                return lo, probes, True
            n = min(limit, n * 2)
        else:
            hi = n
            break
    if hi is None:
        # Out of probes while doubling: the answer is at least lo.
        return lo, probes, False
    while len(probes) < max_probes and hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if mid <= lo:
            mid = lo + step
        if mid >= hi:
            break
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes, hi - lo <= step
