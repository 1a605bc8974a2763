"""blrppl: fit NumPyro models with the Bayesian learning rule (Khan & Rue).

The public surface is exactly the one in ``shared/API.md``.
"""

from blrppl.errors import ModelError

__version__ = "0.1.0"

__all__ = ["ModelError", "__version__"]
