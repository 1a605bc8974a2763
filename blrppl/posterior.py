"""q as numpyro distributions in each site's own support.

Families convert themselves (``family.to_numpyro``). A Gaussian on an
unconstrained space is pushed through its transform; numpyro has no
``mean``/``variance`` for such a distribution, so :class:`TransformedGaussian`
computes them by Gauss-Hermite quadrature on each coordinate's marginal (exact
to quadrature precision for elementwise transforms such as ``exp``), or from a
fixed set of joint draws for transforms that mix coordinates (``CorrCholesky``).
A Gaussian over a value with several joint axes is one flat block, shown in
the value's shape (:class:`ReshapedGaussian`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions.util import lazy_property

QUADRATURE_POINTS = 64
JOINT_DRAWS = 10_000


class TransformedGaussian(dist.TransformedDistribution):
    """A Gaussian pushed through an elementwise bijection, with moments.

    Args:
      loc, scale: the marginal means and standard deviations on the
        unconstrained space (used for the moments).
      base: the Gaussian (Normal or MultivariateNormal) on that space.
      transform: the numpyro transform to the site's support.
    """

    pytree_data_fields = ("_loc", "_scale")

    def __init__(self, base, transform, loc, scale):
        self._loc = loc
        self._scale = scale
        super().__init__(base, transform)

    def _moment(self, power: int) -> Any:
        if not _elementwise(self.transforms):
            # A transform that mixes coordinates (CorrCholesky, StickBreaking):
            # a fixed set of joint draws (deterministic, ~1% of a sd).
            draws = self.sample(jax.random.key(0), (JOINT_DRAWS,))
            return jnp.mean(draws**power, axis=0)
        nodes, weights = np.polynomial.hermite_e.hermegauss(QUADRATURE_POINTS)
        weights = weights / math.sqrt(2.0 * math.pi)
        u = self._loc[..., None] + self._scale[..., None] * nodes
        values = self.transforms[0](u) if len(self.transforms) == 1 else _apply_all(self.transforms, u)
        return jnp.sum(weights * values**power, axis=-1)

    @property
    def mean(self):
        return _first_two_moments(self)[0]

    @property
    def variance(self):
        m1, m2 = _first_two_moments(self)
        return m2 - m1**2


@jax.jit
def _first_two_moments(d: TransformedGaussian) -> tuple:
    """E[x] and E[x²] of a :class:`TransformedGaussian`, in one compiled program per structure
    (eagerly, each of the quadrature's operations would compile its own)."""
    return d._moment(1), d._moment(2)


def _elementwise(transforms) -> bool:
    """Whether every transform acts on each coordinate alone (exp, sigmoid, affine, ...)."""
    for t in transforms:
        while isinstance(t, dist.transforms.IndependentTransform):
            t = t.base_transform
        if isinstance(t, dist.transforms.ReshapeTransform):  # loc and scale have the value's shape
            continue
        if t.domain.event_dim != 0 or t.codomain.event_dim != 0:
            return False
    return True


def _apply_all(transforms, u):
    for t in transforms:
        if not isinstance(t, dist.transforms.ReshapeTransform):
            u = t(u)
    return u


class ReshapedGaussian(dist.TransformedDistribution):
    """A full-covariance Gaussian over a flat vector, shown in its value's shape.

    The q of a latent with several joint axes (a (6, 2) matrix without plates)
    is one Gaussian over the flattened value (C order); ``mean`` and
    ``variance`` have the value's shape and ``covariance_matrix`` is the
    covariance of the flattened value.
    """

    pytree_aux_fields = ("_shape",)

    def __init__(self, base: dist.MultivariateNormal, shape: tuple):
        self._shape = tuple(shape)
        transform = dist.transforms.ReshapeTransform(self._shape, (math.prod(self._shape),))
        super().__init__(base, transform)

    @property
    def mean(self):
        loc = self.base_dist.loc
        return jnp.reshape(loc, loc.shape[:-1] + self._shape)

    @property
    def variance(self):
        var = jnp.diagonal(self.base_dist.covariance_matrix, axis1=-2, axis2=-1)
        return jnp.reshape(var, var.shape[:-1] + self._shape)

    @property
    def covariance_matrix(self):
        return self.base_dist.covariance_matrix


def q_distribution(q: Any, natural: Any) -> dist.Distribution:
    """The numpyro distribution of one variable's q, in the site's support."""
    base = q.family.to_numpyro(natural)
    if q.family.event_ndim == 1 and len(q.block_shape) > 1 and not q.family.chain:
        base = ReshapedGaussian(base, q.block_shape)
    if q.transform is None:
        return base
    if q.family.event_ndim == 0:
        loc, scale = base.loc, base.scale
    else:
        loc = base.mean
        scale = jnp.sqrt(base.variance)
    return TransformedGaussian(base, q.transform, loc, scale)


def block_marginals(q: Any, natural: Any) -> dict:
    """Site name -> marginal of a joint Gaussian block, in the site's support."""
    joint = q.family.to_numpyro(natural)
    loc, cov = joint.loc, joint.covariance_matrix
    out = {}
    for node, transform, shape, offset, size in q.transform.pieces():
        m = loc[offset : offset + size]
        c = cov[offset : offset + size, offset : offset + size]
        sd = jnp.sqrt(jnp.diagonal(c))
        if shape == ():
            base = dist.Normal(m[0], sd[0])
            loc_s, scale_s = m[0], sd[0]
        else:
            base = dist.MultivariateNormal(m, covariance_matrix=c)
            loc_s, scale_s = m, sd
            if len(shape) > 1:  # a matrix latent: its moments in its own shape
                base = ReshapedGaussian(base, shape)
                loc_s, scale_s = jnp.reshape(m, shape), jnp.reshape(sd, shape)
        if is_identity(transform):
            out[node.name] = base
        else:
            out[node.name] = TransformedGaussian(base, transform, loc_s, scale_s)
    return out


def is_identity(transform: Any) -> bool:
    import numpyro.distributions.transforms as T

    while isinstance(transform, T.IndependentTransform):
        transform = transform.base_transform
    return isinstance(transform, T.IdentityTransform)


def posterior_distributions(plan: Any, natural: dict) -> dict:
    """Latent site name -> q's marginal as a numpyro distribution (``result.posterior``).

    The conversions from λ run as one compiled program per plan signature
    (eagerly, each of their dozens of small operations compiles a program
    of its own: about 1 s for a regression's three sites); distributions that
    numpyro's pytree flattening would not carry whole are built eagerly.
    numpyro's argument validation is off: q's parameters are valid by
    construction (every step checks them), and validating them eagerly
    compiles a program per check (2-3 s for a MultivariateNormal).
    """
    from blrppl.compile_mode import ONE_SHOT_BYTES, fast_compile

    key = (plan.signature, fast_compile(plan.arrays, ONE_SHOT_BYTES))
    with numpyro.validation_enabled(False):
        build = _COMPILED_BUILDERS.get(key)
        if build is None:
            build = _compiled_builder(plan.qs, key[1])
            _COMPILED_BUILDERS[key] = build
            while len(_COMPILED_BUILDERS) > _MAX_BUILDERS:
                _COMPILED_BUILDERS.pop(next(iter(_COMPILED_BUILDERS)))
        if build is not False:
            try:
                return build(natural)
            except _NotWhole:
                _COMPILED_BUILDERS[key] = False
        return _distributions(plan.qs, natural)


_COMPILED_BUILDERS: dict = {}
_MAX_BUILDERS = 64


class _NotWhole(Exception):
    """A distribution that numpyro's pytree flattening would not carry whole."""


def _distributions(qs: dict, natural: dict) -> dict:
    out = {}
    for v, q in qs.items():
        if q.joint:
            out.update(block_marginals(q, natural[v]))
        else:
            out[v] = q_distribution(q, natural[v])
    return out


def _compiled_builder(qs: dict, fast: bool):
    from blrppl.compile_mode import SizeDependentJit

    def build(natural):
        out = _distributions(qs, natural)
        if not all(_flattens_whole(d) for d in out.values()):
            raise _NotWhole
        return out

    return SizeDependentJit(build, fast=fast)


def _flattens_whole(d: Any) -> bool:
    """Whether numpyro's pytree flattening of ``d`` keeps every attribute it holds
    (lazy properties are recomputed after it), nested distributions included."""
    cls = type(d)
    kept = set(cls.gather_pytree_data_fields()) | set(cls.gather_pytree_aux_fields())
    for name, value in vars(d).items():
        if name not in kept and not isinstance(getattr(cls, name, None), lazy_property):
            return False
        if isinstance(value, dist.Distribution) and not _flattens_whole(value):
            return False
    return True
