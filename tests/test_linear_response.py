"""Linear response flags a mean-field fit whose spread is confidently too small (blrppl.linear_response)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import blrppl
from blrppl.choosing import jointly
from blrppl.linear_response import UNDERSTATED_SD, spread_left_out

A, B, N = 12, 8, 300


def _crossed_mean(a, b):
    """mu + ea[a] + eb[b]: two crossed random effects with known scales."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("A", A):
        ea = numpyro.sample("ea", dist.Normal(0.0, 0.8))
    with numpyro.plate("B", B):
        eb = numpyro.sample("eb", dist.Normal(0.0, 0.6))
    return mu + ea[a] + eb[b]


def crossed(a, b, y=None):
    """Two crossed random effects with known scales: every factor conjugate, the posterior Gaussian."""
    mean = _crossed_mean(a, b)
    with numpyro.plate("N", a.shape[0]):
        numpyro.sample("y", dist.Normal(mean, 1.0), obs=y)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, A, N), rng.integers(0, B, N)
    y = 1.0 + rng.normal(0, 0.8, A)[a] + rng.normal(0, 0.6, B)[b] + rng.normal(0, 1.0, N)
    return jnp.asarray(a), jnp.asarray(b), jnp.asarray(y)


def exact_precision(a, b):
    """The posterior precision of (mu, ea, eb): the design's cross-products plus the priors'."""
    x = np.zeros((N, 1 + A + B))
    x[:, 0] = 1.0
    x[np.arange(N), 1 + np.asarray(a)] = 1.0
    x[np.arange(N), 1 + A + np.asarray(b)] = 1.0
    prior = np.concatenate([[1 / 25.0], np.full(A, 1 / 0.64), np.full(B, 1 / 0.36)])
    return x.T @ x + np.diag(prior)


def test_the_ratio_is_exact_on_a_gaussian_posterior_and_the_fit_is_flagged(data):
    a, b, y = data
    result = blrppl.VMP(crossed).run(jax.random.key(0), 500, a, b, progress_bar=False, tol=1e-12, y=y)
    precision = exact_precision(a, b)
    marginal_sd = np.sqrt(np.diag(np.linalg.inv(precision)))
    # Mean-field's sds are the conditionals' (1 / sqrt(P_ii)): the understatement measured.
    post = result.posterior
    fitted_sd = np.concatenate([np.ravel(post[s].scale) for s in ("mu", "ea", "eb")])
    np.testing.assert_allclose(fitted_sd, 1 / np.sqrt(np.diag(precision)), rtol=1e-6)
    ratio = marginal_sd / fitted_sd
    found = spread_left_out(result.plan, result.state.natural, result.state.params)
    assert found.definite
    expected = {"mu": ratio[0], "ea": ratio[1 : 1 + A].max(), "eb": ratio[1 + A :].max()}
    for site, value in expected.items():
        assert found.ratio[site] == pytest.approx(value, rel=1e-6)
    assert expected["mu"] > 2 * UNDERSTATED_SD  # the design makes mean-field's error large
    flags = [f for f in result.flags if "understates the posterior spread" in f]
    assert len(flags) == 1 and "'mu'" in flags[0] and "blocks='all'" in flags[0]


def test_the_joint_refit_is_the_exact_posterior_and_unflagged(data):
    """``jointly`` (what the command line refits with): every factor conjugate, so one block over
    the Gaussian latents the check read, whose q is then the exact Gaussian posterior."""
    a, b, y = data
    flagged = blrppl.VMP(crossed).run(jax.random.key(0), 500, a, b, progress_bar=False, tol=1e-12, y=y)
    joint = jointly(crossed, flagged, a, b, y=y)
    assert joint is not None and joint.name == "NonConjugateVI"
    result = joint.engine.fit(joint.plan, jax.random.key(0), 500, progress_bar=False, tol=1e-12)
    assert result.converged and result.flags == ()
    cov = np.linalg.inv(exact_precision(a, b))
    post = result.posterior
    fitted_sd = np.concatenate([np.ravel(np.sqrt(np.asarray(post[s].variance))) for s in ("mu", "ea", "eb")])
    np.testing.assert_allclose(fitted_sd, np.sqrt(np.diag(cov)), rtol=1e-4)  # (the joint block's steps are damped)
    assert jointly(crossed, result, a, b, y=y) is None  # nothing left to join


def independent(y=None):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("G", 4):
        theta = numpyro.sample("theta", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y[0])
    with numpyro.plate("G", 4):
        numpyro.sample("z", dist.Normal(theta, 1.0), obs=y[1:])


def test_blocks_that_share_no_factor_are_not_checked_and_uncoupled_ones_give_one():
    y = jnp.asarray([0.5, 1.0, -0.3, 0.2, 0.8])
    result = blrppl.VMP(independent).run(jax.random.key(0), 100, progress_bar=False, y=y)
    found = spread_left_out(result.plan, result.state.natural, result.state.params)
    assert found is None  # no factor touches two Gaussian blocks: nothing for mean-field to drop
    assert result.flags == ()


def crossed_noise(a, b, y=None):
    """:func:`crossed` with the noise scale learnt under a half-normal prior (not conjugate)."""
    mean = _crossed_mean(a, b)
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("N", a.shape[0]):
        numpyro.sample("y", dist.Normal(mean, sigma), obs=y)


def test_the_command_line_fits_known_scales_exactly(data, monkeypatch, capsys):
    """Every factor conjugate and the Gaussians in one joint block: the exact posterior at once."""
    from blrppl import cli
    from models import ZooModel

    a, b, y = data
    zoo = {"crossed": ZooModel("crossed", crossed, lambda: ((a, b), {"y": y}), "crossed effects, known scales")}
    monkeypatch.setattr(cli, "load_zoo", lambda: zoo)
    assert cli.main(["fit", "crossed", "--steps", "300", "--tol", "1e-10", "--draws", "4000", "--quiet", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "with ConjugateBayes" in out and "Refitted" not in out and "Flag:" not in out
    mu_sd = float(next(line for line in out.splitlines() if line.split()[:1] == ["mu"]).split()[2])
    assert mu_sd == pytest.approx(np.sqrt(np.linalg.inv(exact_precision(a, b))[0, 0]), rel=0.05)  # draws: 4000


def test_the_command_line_refits_a_flagged_mean_field_fit_jointly(data, monkeypatch, capsys):
    """With the noise scale learnt, the mean-field NonConjugateVI fit is flagged and refitted with one
    Gaussian block over (mu, ea, eb, sigma): mu's sd as the exact posterior's given the noise (sigma
    is well determined by 300 rows), where mean-field's is several times smaller."""
    from blrppl import cli
    from models import ZooModel

    a, b, y = data
    zoo = {"crossed": ZooModel("crossed", crossed_noise, lambda: ((a, b), {"y": y}), "crossed effects")}
    monkeypatch.setattr(cli, "load_zoo", lambda: zoo)
    assert cli.main(["fit", "crossed", "--steps", "300", "--tol", "1e-10", "--draws", "4000", "--quiet", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "with NonConjugateVI" in out and "Refitted with NonConjugateVI" in out and "Flag:" not in out
    row = lambda name: next(line for line in out.splitlines() if line.split()[:1] == [name]).split()  # noqa: E731
    tau = 1.0 / float(row("sigma")[1]) ** 2
    prior = np.diag(np.concatenate([[1 / 25.0], np.full(A, 1 / 0.64), np.full(B, 1 / 0.36)]))
    given_tau = tau * (exact_precision(a, b) - prior) + prior  # the design's cross-products scale with tau
    assert float(row("mu")[2]) == pytest.approx(np.sqrt(np.linalg.inv(given_tau)[0, 0]), rel=0.1)


def gamma_poisson(y=None):
    """Rates per group with a latent Gamma shape and rate: b's q is Gamma (conjugate), a's Gaussian
    on log a; the posterior couples them strongly (their ratio is the groups' mean rate)."""
    a = numpyro.sample("a", dist.Exponential(0.5))
    b = numpyro.sample("b", dist.Exponential(0.5))
    with numpyro.plate("g", y.shape[0]):
        lam = numpyro.sample("lam", dist.Gamma(a, b))
        numpyro.sample("y", dist.Poisson(lam), obs=y)


def _gamma_poisson_fit():
    rng = np.random.default_rng(1)
    y = jnp.asarray(rng.poisson(rng.gamma(3.0, 1 / 1.5, 30)))
    result = blrppl.NonConjugateVI(gamma_poisson).run(jax.random.key(0), 2000, progress_bar=False, tol=1e-8, y=y)
    return y, result


def test_a_gamma_q_is_read_on_its_log_and_its_coupling_with_a_gaussian_one_is_flagged():
    y, result = _gamma_poisson_fit()
    assert result.plan.qs["b"].family.name == "Gamma" and result.plan.qs["a"].family.gaussian
    found = spread_left_out(result.plan, result.state.natural, result.state.params)
    assert found.definite and found.ratio["a"] > 4 and found.ratio["b"] > 4
    assert any("understates the posterior spread of 'a'" in f for f in result.flags)


@pytest.mark.slow  # NUTS
def test_the_ratio_reads_the_spread_nuts_finds():
    from numpyro.infer import MCMC, NUTS

    y, result = _gamma_poisson_fit()
    found = spread_left_out(result.plan, result.state.natural, result.state.params)
    mcmc = MCMC(NUTS(gamma_poisson), num_warmup=1000, num_samples=2000, progress_bar=False)
    mcmc.run(jax.random.key(2), y=y)
    draws, q = mcmc.get_samples(), result.get_samples(jax.random.key(1), 4000)
    for site in ("a", "b"):
        # On the log scale NUTS's sd is about 4.6x q's; linear response (a Gaussian reading of the
        # curvature at q's mean) reads about 6.8x: it overstates a skewed scale's factor somewhat.
        measured = float(np.std(np.log(draws[site])) / np.std(np.log(q[site])))
        assert measured > 2 * UNDERSTATED_SD and measured / 1.25 < found.ratio[site] < 1.6 * measured, (site, measured)


def varying(group, x, y=None):
    """Group intercepts around a latent mean with a latent scale, a shared slope on x."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("G", 15):
        alpha = numpyro.sample("alpha", dist.Normal(mu, tau))
    beta = numpyro.sample("beta", dist.Normal(0.0, 2.0))
    with numpyro.plate("N", x.shape[0]):
        numpyro.sample("y", dist.Normal(alpha[group] + beta * x, 1.0), obs=y)


def _varying_data(seed, zero_groups=()):
    rng = np.random.default_rng(seed)
    group = np.arange(150) % 15
    x = rng.normal(size=150)
    x[np.isin(group, zero_groups)] = 0.0  # a covariate 0 in every row of some groups
    y = rng.normal(0.5, 0.7, 15)[group] + 0.3 * x + rng.normal(size=150)
    return jnp.asarray(group), jnp.asarray(x), jnp.asarray(y)


def _full_reading(result):
    """The check's ratios read from the full Hessian (D passes), for comparison."""
    from blrppl import linear_response

    check = linear_response._check(result.plan)
    full = linear_response.Reading.full(check._dim, check._dtype, False)
    args = (result.state.natural, dict(result.state.params), result.plan.arrays.data)
    _, ratios, _, _ = check._program(*args, full)
    return check, np.asarray(ratios)


def test_refits_read_the_hessian_from_few_products_and_agree_with_the_full_reading():
    """A first fit learns which entries the model can make nonzero, a covariate's zeros included
    (groups whose x is 0 throughout: the Hessian's own zeros there would hide beta's coupling);
    a refit on data where those x are not 0 reads the Hessian from 5 products, and reads what
    the full Hessian says."""
    engine = blrppl.NonConjugateVI(varying)
    group, x, y = _varying_data(0, zero_groups=(2, 7))
    first = engine.run(jax.random.key(0), 300, group, x, progress_bar=False, tol=1e-8, y=y)
    check, _ = _full_reading(first)
    assert check._sparse is not None and int(check._sparse.count) == 5  # mu, tau, beta alone; alpha; probe
    group, x, y = _varying_data(1)
    refit = engine.run(jax.random.key(0), 300, group, x, progress_bar=False, tol=1e-8, y=y)
    assert refit.plan.signature == first.plan.signature
    found = spread_left_out(refit.plan, refit.state.natural, refit.state.params)
    _, full = _full_reading(refit)
    np.testing.assert_allclose([found.ratio[n] for n in check.names], full, rtol=1e-10)
    assert check._relearned == 0 and check._sparse is not None


def chained(a, b, y=None):
    """Counts with effects of two factors that meet only where the data pair them."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    with numpyro.plate("A", 30):
        ea = numpyro.sample("ea", dist.Normal(0.0, 0.8))
    with numpyro.plate("B", 30):
        eb = numpyro.sample("eb", dist.Normal(0.0, 0.6))
    with numpyro.plate("N", a.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(mu + ea[a] + eb[b])), obs=y)


def test_a_pairing_the_learnt_pattern_lacks_falls_back_to_the_full_reading_and_is_learnt():
    rng = np.random.default_rng(0)
    a = np.arange(120) % 30
    engine = blrppl.NonConjugateVI(chained)
    first = engine.run(jax.random.key(0), 300, jnp.asarray(a), jnp.asarray((a + 1) % 30), progress_bar=False,
                       tol=1e-8, y=jnp.asarray(rng.poisson(3, size=120)))
    check, _ = _full_reading(first)
    assert check._sparse is not None and int(check._sparse.count) == 4  # mu alone; the ea; the eb; probe
    b = (a + 1 + (np.arange(120) >= 60)) % 30  # half the rows now pair ea_i with eb_(i+2)
    refit = engine.run(jax.random.key(0), 300, jnp.asarray(a), jnp.asarray(b), progress_bar=False, tol=1e-8,
                       y=jnp.asarray(rng.poisson(3, size=120)))
    assert refit.plan.signature == first.plan.signature
    assert check._relearned == 1  # the probe disagreed: the full reading answered, and taught the pairs
    _, full = _full_reading(refit)
    found = spread_left_out(refit.plan, refit.state.natural, refit.state.params)  # read with the new pattern
    assert check._relearned == 1 and check._sparse is not None
    np.testing.assert_allclose([found.ratio[n] for n in check.names], full, rtol=1e-10)
    assert full.max() > 2 * UNDERSTATED_SD and any("understates the posterior spread of 'mu'" in f for f in refit.flags)


def _baseball_logit(at_bats, hits=None):
    """numpyro's ``examples/baseball.py`` ``partially_pooled_with_logit``, as written there."""
    loc = numpyro.sample("loc", dist.Normal(-1, 1))
    scale = numpyro.sample("scale", dist.HalfCauchy(1))
    num_players = at_bats.shape[0]
    with numpyro.plate("num_players", num_players):
        alpha = numpyro.sample("alpha", dist.Normal(loc, scale))
        return numpyro.sample("obs", dist.Binomial(at_bats, logits=alpha), obs=hits)


def test_a_check_that_finds_no_gaussian_reading_says_the_spread_is_unchecked():
    """At mean-field q's mean of the baseball model the log density's curvature is indefinite
    (the funnel of loc, scale and alpha): linear response has nothing to compare, and q's sds of
    loc and scale are 0.5 and 0.4 of NUTS's. The fit says its spread is unchecked, not nothing."""
    from blrppl.linear_response import UNCHECKED_FLAG

    rng = np.random.default_rng(7)
    at_bats = jnp.full(18, 45.0)
    hits = jnp.asarray(rng.binomial(45, rng.beta(27, 73, 18)), float)
    result = blrppl.NonConjugateVI(_baseball_logit).run(jax.random.key(0), 500, at_bats, hits=hits, progress_bar=False, tol=1e-8)
    found = spread_left_out(result.plan, result.state.natural, result.state.params)
    assert found is not None and not found.definite
    assert any(flag.startswith(UNCHECKED_FLAG) for flag in result.flags)
    joint = blrppl.NonConjugateVI(_baseball_logit, blocks="all").run(
        jax.random.key(0), 500, at_bats, hits=hits, progress_bar=False, tol=1e-8
    )
    assert not any(flag.startswith(UNCHECKED_FLAG) for flag in joint.flags)


def growth_curves(x, Y=None):
    """BUGS rats: random intercepts and slopes with Gamma precisions; conjugate throughout."""
    alpha_c = numpyro.sample("alpha_c", dist.Normal(0.0, 1000.0))
    beta_c = numpyro.sample("beta_c", dist.Normal(0.0, 1000.0))
    tau_a = numpyro.sample("tau_alpha", dist.Gamma(0.01, 0.01))
    tau_b = numpyro.sample("tau_beta", dist.Gamma(0.01, 0.01))
    tau_c = numpyro.sample("tau_c", dist.Gamma(0.01, 0.01))
    with numpyro.plate("rats", Y.shape[0], dim=-2):
        alpha = numpyro.sample("alpha", dist.Normal(alpha_c, 1 / jnp.sqrt(tau_a)))
        beta = numpyro.sample("beta", dist.Normal(beta_c, 1 / jnp.sqrt(tau_b)))
        with numpyro.plate("weeks", Y.shape[1], dim=-1):
            numpyro.sample("Y", dist.Normal(alpha + beta * x, 1 / jnp.sqrt(tau_c)), obs=Y)


def test_a_joint_gaussian_block_beside_gamma_precisions_is_checked():
    """One Gaussian block over every mean (``VMP(blocks="gaussian")``, what ``choose`` picks for
    this conjugate model) with Gamma precisions beside it: the prior factor of the plated slopes
    joins the block and tau_beta, and their correlation does not vanish element by element.
    Unchecked, tau_beta's sd came out 4x too small (7.8 +- 2.0 against NUTS's 10.6 +- 8.5) with
    no flag; linear response reads it 3.4x too small."""
    rng = np.random.default_rng(1)
    x = np.array([8.0, 15.0, 22.0, 29.0, 36.0]) - 22.0
    a, b = 242 + 14 * rng.standard_normal(30), 6.2 + 0.5 * rng.standard_normal(30)
    Y = jnp.asarray(a[:, None] + b[:, None] * x + 6 * rng.standard_normal((30, 5)))
    result = blrppl.VMP(growth_curves, blocks="gaussian").run(
        jax.random.key(0), 200, jnp.asarray(x), Y=Y, progress_bar=False, tol=1e-8
    )
    assert result.plan.qs["tau_beta"].family.name == "Gamma"
    found = spread_left_out(result.plan, result.state.natural, result.state.params)
    assert found.definite and found.ratio["tau_beta"] > 2.5
    assert any("understates the posterior spread of 'tau_beta'" in f for f in result.flags)
