"""The canary audit of the CorrDP relation (simulations.auditing.corrdp): the claim against
the Gaussian closed form, the honest mechanism within its claim, and the planted bugs
(insensitive noise scaled by the TV without its inflation, or by an underestimated TV)
caught, through the real ``corrdp`` client and strategy."""

from __future__ import annotations

import json
import math

import pytest

from simulations.audit import CORRDP_BUG_NAMES
from simulations.auditing.bugs import CORRDP_BUGS, corrdp_planted
from simulations.auditing.corrdp import CorrDPAuditSetup, claim, claimed_std, design, run_corrdp_audit
from simulations.cli import main
from tests.references import gaussian_eps_ref


def test_claim_is_the_gaussian_pair_of_the_canary_class():
    setup = CorrDPAuditSetup(rounds=3)
    can = design(setup)
    est = can.estimate
    assert est.bound_valid and est.tv_tilde == pytest.approx(est.tv_hat + est.inflation)
    assert abs(est.tv_hat - setup.correlation) < 0.03  # TV = rho in closed form
    k = setup.canaries
    share = 1 / math.sqrt(k + 2)  # k canary blocks, the sensitive block (bound 1 each) and the bias
    std = setup.noise_multiplier * setup.clipping_norm * math.sqrt(max(est.tv_tilde, 1 / (k + 1) ** 2))
    assert claimed_std(can) == pytest.approx(std)
    mu = 2 * setup.clipping_norm * share / std  # the canary's own block; cross terms are O(D) = O(0.01)
    c = claim(can)
    assert gaussian_eps_ref(mu, setup.delta) <= c.class_epsilon
    assert c.class_epsilon <= gaussian_eps_ref(1.02 * mu, setup.delta) + 0.05
    assert c.allowance == pytest.approx(c.corrdp_epsilon / est.tv_tilde)
    assert c.class_epsilon <= c.allowance  # eps_c is the stricter claim


def test_corrdp_bugs_are_mechanisms_and_unknown_ones_refused():
    assert set(CORRDP_BUG_NAMES) == set(CORRDP_BUGS)
    for name, bug in CORRDP_BUGS.items():
        assert bug.name == name and bug.component == "mechanism"
    with pytest.raises(ValueError, match="unknown for the corrdp relation"):
        corrdp_planted("low-noise")


def test_cli_corrdp_json_and_relation_mismatch(capsys):
    assert main(["audit", "--relation", "corrdp", "--json", "--rounds", "3"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["relation"] == "corrdp" and row["bug"] is None and row["trials"] > 0
    keys = {"epsilon_lower", "epsilon_claimed", "epsilon_corrdp", "allowance", "tv_claimed", "tv_hat"}
    assert keys <= set(row)
    assert main(["audit", "--break", "tv-no-inflation"]) == 2  # a CorrDP bug needs --relation corrdp
    assert "--relation corrdp" in capsys.readouterr().err
    assert main(["audit", "--relation", "corrdp", "--break", "low-noise"]) == 2
    assert "not a CorrDP bug" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("bug", [None, "tv-no-inflation", "tv-underestimated"])
def test_corrdp_audit_passes_the_mechanism_and_catches_the_planted_bugs(bug):
    res = run_corrdp_audit(CorrDPAuditSetup(rounds=300, seed=2, secret_seed=7), bug)
    assert res["trials"] == 2 * 300 * 48 // 3
    if bug is None:
        assert not res["violated"] and res["epsilon_lower"] > 0.5, res
    else:
        assert res["violated"], res
