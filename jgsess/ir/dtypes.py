"""The dtypes the passes treat alike."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# the narrow floating-point types: a program's bf16/f16 arrays, which casts, widening and the
# optimizer fusions recognize (an update written in them has its own kernel forms)
NARROW = (np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))
