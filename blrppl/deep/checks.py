"""Doubts about a diagonal-Gaussian fit: divergence is an error, the rest are flags."""

from __future__ import annotations

import jax
import numpy as np

from blrppl.compile_mode import to_host
from blrppl.deep.flat import FlatModel
from blrppl.deep.rules import DiagonalState, Rule, rademacher_diagonal
from blrppl.errors import ModelError

#: A run has not settled when its ELBO estimates rose this many standard
#: errors between the third and the last quarter of the run.
TREND_SE = 4.0


def raise_if_diverged(flat: FlatModel, state: DiagonalState, rule: str) -> None:
    """A ``ModelError`` naming the first site whose q is not finite."""
    mean, precision = np.asarray(state.mean), np.asarray(state.precision)
    bad = ~(np.isfinite(mean) & np.isfinite(precision) & (precision > 0))
    if not bad.any():
        return
    offset = 0
    for site in flat.sites:
        if bad[offset : offset + site.size].any():
            raise ModelError(
                f"site {site.name!r}: the {rule} run diverged (q's mean or precision is not finite); "
                "lower learning_rate, raise hess_init, set clip=..., or check the model's scales."
            )
        offset += site.size


def convergence_flags(rule: Rule, elbo) -> tuple[str, ...]:
    """Flags: an uncalibrated row's variances; ELBO estimates still rising at the end."""
    flags = []
    if not rule.calibrated:
        flags.append(
            f"rule {rule.name!r}: 1 / s comes from squared minibatch gradients (Eq. 38), not the Hessian; "
            "its variances are not posterior variances (Khan et al. 2018, Thm. 1): use rule 'ivon' or "
            "'vogn' for uncertainty"
        )
    elbo = np.asarray(elbo, dtype=float)
    quarter = len(elbo) // 4
    if quarter >= 10:
        third, last = elbo[-2 * quarter : -quarter], elbo[-quarter:]
        if not (np.isfinite(third).all() and np.isfinite(last).all()):
            flags.append("the ELBO estimates are not finite at the end of the run: it has not settled")
        else:
            se = np.sqrt(third.var() / len(third) + last.var() / len(last))
            rise = last.mean() - third.mean()
            if rise > TREND_SE * se and rise > 1e-3 * (1.0 + abs(last.mean())):
                flags.append(
                    f"the ELBO still rose by {rise:.3g} ({rise / se:.1f} standard errors) over the last quarter "
                    "of the run: q has not converged; run more steps (init_state=result.state goes on)"
                )
    return tuple(flags)


#: A coordinate is "prior-dominated" when the data give under this share of q's precision.
DATA_SHARE = 0.1
#: The flag is raised when more than this fraction of the coordinates are prior-dominated.
PRIOR_DOMINATED = 0.5
#: Rademacher probes of the priors' curvature.
PROBES = 16


def data_share(flat: FlatModel, mean: jax.Array, precision: jax.Array, arrays: tuple, key: jax.Array) -> jax.Array:
    """Per coordinate, 1 - r / s: the share of q's precision s that is not the prior's curvature r.

    r = diag ∇²R(m) of the non-observation terms (priors, log-Jacobians), by a
    Rademacher probe (exact for independent priors). Where the share is near
    0, q is the prior: the data did not move that coordinate.
    """
    rows = None
    if flat.subsample.batch_size < flat.subsample.size:
        rows = jax.numpy.arange(flat.subsample.batch_size)

    def rest(u):
        return flat.split_loss(u, rows, arrays)[1]

    hvp = lambda z: jax.jvp(jax.grad(rest), (mean,), (z,))[1]
    keys = jax.random.split(key, PROBES)  # exact for independent priors; averaged for coupled ones
    curvature = jax.vmap(lambda k: rademacher_diagonal(hvp, k, mean.shape[0], mean.dtype))(keys).mean(0)
    return 1.0 - curvature / precision


def prior_flags(share) -> tuple[str, ...]:
    """A flag when q equals the prior on most coordinates (mean-field collapse)."""
    share = np.asarray(share)
    dominated = float(np.mean(share < DATA_SHARE))
    if share.size < 10 or dominated <= PRIOR_DOMINATED:
        return ()
    return (
        f"q is the prior on {100 * dominated:.0f}% of the {share.size} latent coordinates (the data give under "
        f"{100 * DATA_SHARE:.0f}% of their precision): under this mean-field q the data barely inform most of the "
        "model. For a wide neural network this is mean-field VI's known collapse (Coker et al. 2022), not a bug "
        "in the run: its predictions are close to the prior's; use a narrower model, a MAP fit, or NUTS",
    )


#: The averaged q is flagged when its mean's Monte Carlo error exceeds this many posterior sds,
#: or its precision's exceeds this relative error.
MEAN_MCSE = 0.1
PRECISION_MCSE = 0.1


def averaging_flags(flat: FlatModel, state: DiagonalState) -> tuple[str, ...]:
    """A flag when the averaged iterates are too noisy to be q (batch means over the averaging window).

    The stochastic iterates scatter around the optimum; their average's
    Monte Carlo error is estimated from the spread of the averages of the
    window's parts (batch means), in posterior sds for m, relatively for s.
    """
    average = to_host(state.average)  # one transfer; in numpy (eager jnp compiles a program per op)
    count = np.asarray(average.count, float)
    if np.any(count < 2):
        return ()
    # DiagonalState.batch_means and .averaged (every batch holds iterates here).
    means, precisions = (np.asarray(a, float) / count[:, None] for a in (average.mean, average.precision))
    mean, precision = (np.sum(np.asarray(a, float), 0) / np.sum(count) for a in (average.mean, average.precision))
    k = len(count)
    mean_error = means.std(0, ddof=1) / np.sqrt(k) * np.sqrt(precision)  # in posterior sds
    precision_error = precisions.std(0, ddof=1) / np.sqrt(k) / precision
    worst = int(np.argmax(np.maximum(mean_error / MEAN_MCSE, precision_error / PRECISION_MCSE)))
    if mean_error[worst] <= MEAN_MCSE and precision_error[worst] <= PRECISION_MCSE:
        return ()
    return (
        f"site {_site_of(flat, worst)!r}: the averaged iterates are noisy (Monte Carlo error of q's mean "
        f"{mean_error[worst]:.2g} posterior sds, of its precision {100 * precision_error[worst]:.0f}%, from batch "
        "means over the averaging window); lower learning_rate, raise num_samples or the minibatch size, or "
        "run more steps",
    )


def _site_of(flat: FlatModel, coordinate: int) -> str:
    offset = 0
    for site in flat.sites:
        if coordinate < offset + site.size:
            return site.name
        offset += site.size
    return flat.sites[-1].name
