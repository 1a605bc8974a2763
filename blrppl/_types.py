"""Type aliases shared across blrppl (blackjax ``types.py`` convention)."""

from __future__ import annotations

from typing import Any, Callable, Union

import jax
import numpy as np

Array = jax.Array
ArrayLike = Union[jax.Array, np.ndarray, float, int]
ArrayTree = Any
PRNGKey = jax.Array
Schedule = Callable[[jax.Array], jax.Array]
