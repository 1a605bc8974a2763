"""blrppl: fit NumPyro models with the Bayesian learning rule (Khan & Rue).

The public surface is exactly the one in ``shared/API.md``.
"""

from blrppl.engines.blr import BLR
from blrppl.engines.conjugate import ConjugateBayes
from blrppl.engines.diagonal import DiagonalBLR
from blrppl.engines.em import EM
from blrppl.engines.integrated import Integrated
from blrppl.engines.laplace import Laplace
from blrppl.engines.nonconjugate import NonConjugateVI
from blrppl.engines.svi import SVI
from blrppl.engines.vmp import VMP
from blrppl import blr
from blrppl.errors import ModelError, RuntimeDeadlock
from blrppl.graph import FactorGraph
from blrppl.tracing import trace
from blrppl.choosing import choose
from blrppl.results import BLRResult
from blrppl.saving import load
from blrppl import sharding
from blrppl.sharding import shard
from blrppl.compilation_cache import enable_compilation_cache, enable_from_environment, stable_distribution_pytrees
from blrppl.compile_mode import set_compile_mode

stable_distribution_pytrees()
enable_from_environment()

__version__ = "0.1.0"

__all__ = [
    "DiagonalBLR",
    "BLR",
    "BLRResult",
    "ConjugateBayes",
    "EM",
    "FactorGraph",
    "Integrated",
    "Laplace",
    "ModelError",
    "NonConjugateVI",
    "RuntimeDeadlock",
    "SVI",
    "VMP",
    "__version__",
    "choose",
    "shard",
    "enable_compilation_cache",
    "set_compile_mode",
    "load",
    "trace",
]
