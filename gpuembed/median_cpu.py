"""Compiled median of a float64 array by radix selection (Backend.median on the CPU).

Each value's bits become an unsigned key in the values' order (negatives flipped
below the nonnegatives), and the middle rank is found a DIGIT-bit digit at a time
from the top: one histogram pass over the keys for the leading digit (sign and
exponent: the binade), then one pass per further digit counting only the keys that
share the digits found so far, until at most FEW keys are left, which are gathered
and sorted.  No counting pass branches on the data, and nothing larger than FEW
keys is allocated.  On t-SNE's 58,124 edges of rotating_objects it takes 0.20 ms
where NumPy's partition around the two middle ranks took 0.69-0.80 ms (the arrays
out of cache between calls, as in a fit; 0.043 against 0.105 ms at 720 values, 85
against 192 ms at 9.9 million), the same value.
"""
from __future__ import annotations

import numpy as np
from numba import njit

DIGIT = 12
FEW = 64
HIGH = np.uint64(1 << 63)


@njit(cache=True, inline="always")
def _key(bits):
    # Nonnegative floats' bits with the top bit set, negatives' bits all flipped.
    return bits ^ (HIGH | (np.uint64(0) - (bits >> np.uint64(63))))


@njit(cache=True)
def _middle_keys(bits, k):
    """(key of rank k, key of rank k - 1, whether the latter was found on the way:
    in rank k's last bucket)."""
    counts = np.zeros(1 << DIGIT, dtype=np.int64)
    shift, step = 64 - DIGIT, DIGIT
    s = np.uint64(shift)
    for b in bits:
        counts[_key(b) >> s] += 1
    prefix = np.uint64(0)           # the digits of rank k's key found so far
    while True:
        bucket = 0
        while k >= counts[bucket]:
            k -= counts[bucket]
            bucket += 1
        prefix = (prefix << np.uint64(step)) | np.uint64(bucket)
        if counts[bucket] <= FEW or shift == 0:
            break
        step = min(DIGIT, shift)
        known = np.uint64(shift)
        shift -= step
        s, mask = np.uint64(shift), np.uint64((1 << step) - 1)
        counts[:] = 0
        for b in bits:
            x = _key(b)
            counts[(x >> s) & mask] += (x >> known) == prefix
    if shift == 0:                  # every key left equals prefix
        return prefix, prefix, k > 0
    few = np.empty(counts[bucket], dtype=np.uint64)
    j = 0
    s = np.uint64(shift)
    for b in bits:
        x = _key(b)
        if x >> s == prefix:
            few[j] = x
            j += 1
    for i in range(1, j):           # insertion sort: numba's sort took seconds to compile
        x, t = few[i], i
        while t > 0 and few[t - 1] > x:
            few[t] = few[t - 1]
            t -= 1
        few[t] = x
    return few[k], few[max(k - 1, 0)], k > 0


@njit(cache=True)
def middle_values(values):
    """(the value of rank n // 2 - 1, that of rank n // 2) of the 1-D float64
    ``values`` (n of them, finite, n >= 1; for odd n both are rank n // 2's): as
    NumPy's partition orders them."""
    bits = values.view(np.uint64)
    n = bits.size
    hi, lo, found = _middle_keys(bits, n // 2)
    if n % 2:
        lo = hi
    elif not found:                 # below rank k's bucket: the largest key there
        lo = np.uint64(0)
        for b in bits:
            x = _key(b)
            lo = max(lo, x * np.uint64(x < hi))
    keys = np.empty(2, dtype=np.uint64)
    for i, x in enumerate((lo, hi)):    # back to the values' bits
        keys[i] = x ^ HIGH if x & HIGH else ~x
    out = keys.view(np.float64)
    return out[0], out[1]
