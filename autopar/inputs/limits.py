"""Documented maxima of the numbers a user gives, checked before any enumeration (issue 15).

Every number that sizes a loop or a table (the GPU count's divisors, the batch's divisors, the
micro-batch and virtual-stage ranges, the runners-up) is bounded here, so no input can make
autopar enumerate for ever whatever ``--time-limit`` says (``--gpus 2**63`` used to take
divisors up to 3e9). The bounds are far beyond any real job and are stated in the README and
in each error message.
"""

from __future__ import annotations

import math
import numbers
import operator

from autopar.base.axes import VPP_CAP
from autopar.base.errors import InputError, excerpt

MAX_GPUS = 1 << 20
"""``--gpus``, ``--gpus-per-node``, pins and ``--max-*`` limits: 1,048,576 GPUs."""
MAX_SEQ_LEN = 1 << 24
"""``--seq-len``: 16 Mi tokens."""
MAX_GLOBAL_BATCH = 1 << 24
"""``--global-batch``: 16 Mi sequences per step."""
MAX_GLOBAL_BATCH_TOKENS = 1 << 40
"""``--global-batch-tokens``: 1 Ti tokens per step."""
MAX_MBS = 1 << 12
"""``--max-mbs`` (and the ``--mbs`` pin): 4096 sequences."""
MAX_VPP = VPP_CAP
"""``--max-vpp`` (and the ``--vpp`` pin): 64 virtual stages per pipeline rank."""
MAX_TOP = 100
"""``--top``: runners-up reported."""
MAX_TIME_LIMIT_S = 1e6
"""``--time-limit``: about 11.6 days."""
MAX_WORKERS = 256
"""``--num-workers``: CP-SAT threads."""
MAX_JOBS = 64
"""``autopar sweep --jobs``: worker processes (each loads autopar: about 150 MB)."""
MAX_SWEEP_POINTS = 1024
"""``autopar sweep``: grid points (GPU counts x GPU types x sequence lengths)."""
MAX_TRAIN_TOKENS = 1e18
MAX_GPU_HOUR_COST = 1e9


def as_int(value: object, *, source: str) -> int:
    """``value`` as an int: an ``int`` or anything that is one (``operator.index``: numpy
    integers); a bool, a float (``1024.0``: pass ``1024``), a string or None is an
    ``InputError`` saying what was given. One rule for every count the API takes (issue 24:
    ``gpus=1024.0`` was refused confusingly while ``jobs=2.0`` passed, ``np.int64(64)`` and
    ``num_workers=2.0`` failed)."""
    if value is None:
        raise InputError("is required: give an integer", source=source)
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        raise InputError(f"must be an integer, got {excerpt(value)}", source=source)
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        hint = f" (pass {int(value)})" if whole else ""
        raise InputError(
            f"must be an integer, got the {type(value).__name__} {excerpt(value)}{hint}",
            source=source,
        )
    try:
        return operator.index(value)
    except TypeError:
        raise InputError(f"must be an integer, got {excerpt(value)}", source=source) from None


def check_int(value: object, *, source: str, maximum: int, minimum: int = 1) -> int:
    """``value`` as an int (``as_int``) in ``minimum..maximum``, else an ``InputError`` naming
    ``source`` (the flag as the user types it) and the bound."""
    number = as_int(value, source=source)
    if not minimum <= number <= maximum:
        raise InputError(f"{range_rule(minimum, maximum)}, got {excerpt(number)}", source=source)
    return number


def range_rule(minimum: int, maximum: int) -> str:
    """``must be a positive integer <= 1,048,576`` (or ``... in 0..N``)."""
    if minimum == 1:
        return f"must be a positive integer <= {maximum:,}"
    if minimum == 0:
        return f"must be a non-negative integer <= {maximum:,}"
    return f"must be an integer in {minimum:,}..{maximum:,}"


def check_number(
    value: object, *, source: str, maximum: float, minimum: float = 0.0, inclusive: bool = False
) -> float:
    """``value`` as a finite float above ``minimum`` (or equal, with ``inclusive``) and at most
    ``maximum``; NaN and infinities are errors."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy numbers are Real
        raise InputError(f"must be a number, got {excerpt(value)}", source=source)
    if isinstance(value, numbers.Integral):
        value = operator.index(value)
    if isinstance(value, int) and value.bit_length() > 64:
        raise InputError(f"must be at most {maximum:g}, got {excerpt(value)}", source=source)
    number = float(value)
    low_ok = number >= minimum if inclusive else number > minimum
    if not (math.isfinite(number) and low_ok and number <= maximum):
        side = ">=" if inclusive else ">"
        raise InputError(
            f"must be a finite number {side} {minimum:g} and <= {maximum:g}, got {excerpt(value)}",
            source=source,
        )
    return number
