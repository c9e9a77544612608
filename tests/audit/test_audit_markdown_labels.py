"""The --fast audit's power rows say they are expected to fail at its trial counts (not a bold NO)."""
from dppo.audit import run as audit_run


def test_reduced_trial_power_rows_are_labelled_as_expected_failures():

    class Row:
        mechanism, entry_point, claimed_eps, delta, eps_lb, passed, trials, seconds, gaussian = (
            "dp_pg_round", "x", 1.0, 1e-5, 0.2, True, 1000, 0.1, True)

        class test:  # noqa: N801 - mirrors MechanismAudit.test
            sign, threshold, false_pos, n_null, false_neg, n_alt, alpha_hi, beta_hi = 1, 0.0, 1, 10, 1, 10, 0.1, 0.1

    fast = audit_run.markdown([Row()], reduced_trials=True)
    full = audit_run.markdown([Row()])
    assert "expected at these trial counts" in fast and "**NO**" not in fast
    assert "**NO**" in full
