import os
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings

sys.path.insert(0, os.path.dirname(__file__))

# Hypothesis profiles (issue 18). "ci": derandomized (the examples are a function of the test
# alone, so two runs of one commit draw the same examples and report the same counts), no
# deadline and no timing health check (a loaded 2-core machine must not turn a run red), no
# example database (a clean checkout and a reused one behave alike), no shrinking (a red run
# stays within the CI time limit and reports the failing example unshrunk, with the blob to
# reproduce it; the dev profile shrinks). "dev": fresh random seeds
# and the local database, for exploring; every counterexample it finds becomes an @example.
# Tests set their own max_examples; the profile's is the default for those that do not.
settings.register_profile(
    "ci", derandomize=True, max_examples=50, deadline=None, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.generate, Phase.target],
)
settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _quiet_cvxpy():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Solution may be inaccurate")
        yield


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
