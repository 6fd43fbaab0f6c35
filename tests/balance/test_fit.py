"""Fitting the balance cost to measured step times (energon.balance.fit): known coefficients come
back from synthetic timings; the fitted cost prices samples from their metadata."""

from __future__ import annotations

import random

import pytest

from energon.balance import MultimodalCost, fit_cost
from energon.balance.fit import FittedCost

TRUE = {"overhead": 0.05, "per_text_token": 2e-5, "per_media_token": 6e-5, "attention": 3e-8}


def synthetic_steps(seed: int, steps: int, noise: float, media: bool = True, overhead=None):
    """Batches of 1-24 samples (short captions to long documents, 0-1,600 patch tokens) and the
    seconds the true model gives them, times a log-normal noise of ``noise``."""
    rng = random.Random(seed)
    batches, seconds = [], []
    for _ in range(steps):
        batch = [
            (int(rng.lognormvariate(5, 1.2)), rng.choice([0, 64, 256, 1024, 1600]) if media else 0)
            for _ in range(rng.randint(1, 24))
        ]
        t = TRUE["overhead"] if overhead is None else overhead
        for text, patches in batch:
            n = text + patches
            t += TRUE["per_text_token"] * text + TRUE["per_media_token"] * patches
            t += TRUE["attention"] * n * n
        batches.append(batch)
        seconds.append(t * rng.lognormvariate(0, noise))
    return batches, seconds


@pytest.mark.parametrize(("noise", "tolerance"), [(0.0, 1e-6), (0.03, 0.1)])
def test_known_coefficients_come_back_from_step_times(noise, tolerance):
    batches, seconds = synthetic_steps(seed=1, steps=60, noise=noise)
    fit = fit_cost(batches, seconds)
    for name, value in TRUE.items():
        assert getattr(fit, name) == pytest.approx(value, rel=tolerance), name
    assert fit.r2 > (0.999999 if noise == 0 else 0.95)
    assert fit.median_error < max(1e-6, 2 * noise)
    assert fit.predict(batches[0]) == pytest.approx(seconds[0], rel=max(1e-6, 5 * noise))


def test_text_only_measurements_fit_no_media_term():
    batches, seconds = synthetic_steps(seed=2, steps=40, noise=0.0, media=False)
    fit = fit_cost(batches, seconds)
    assert fit.per_media_token == 0.0
    assert fit.per_text_token == pytest.approx(TRUE["per_text_token"], rel=1e-6)
    assert fit.attention == pytest.approx(TRUE["attention"], rel=1e-6)


def test_no_coefficient_goes_negative():
    """Step times without a per-step overhead, with noise: plain least squares would give some
    overhead of either sign; the fit keeps every coefficient >= 0 and the others right."""
    batches, seconds = synthetic_steps(seed=3, steps=60, noise=0.02, overhead=0.0)
    fit = fit_cost(batches, seconds)
    assert min(fit.coefficients()) >= 0.0
    assert fit.overhead < 0.01
    for name in ("per_text_token", "per_media_token", "attention"):
        assert getattr(fit, name) == pytest.approx(TRUE[name], rel=0.1), name


def test_the_fitted_cost_prices_samples_by_their_counts():
    fit = fit_cost(*synthetic_steps(seed=4, steps=30, noise=0.0))
    cost = fit.cost_function(MultimodalCost(patch=14))
    assert isinstance(cost, FittedCost) and cost.counter.patch == 14
    assert cost.cost_of_counts(100, 400) == pytest.approx(
        100 * TRUE["per_text_token"] + 400 * TRUE["per_media_token"] + 500**2 * TRUE["attention"]
    )
    assert cost.config()["counter"]["patch"] == 14


def test_bad_measurements_are_refused():
    with pytest.raises(ValueError, match="2 batches but 3"):
        fit_cost([[(1, 0)], [(2, 0)]], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least 4"):
        fit_cost([[(1, 0)]], [1.0])
    with pytest.raises(ValueError, match="positive"):
        fit_cost([[(1, 0)]] * 4, [1.0, 0.0, 1.0, 1.0])
