"""Every reference table says which noise made it, and the secure-noise spread covers one row of each."""
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import secure_spread  # noqa: E402

RESULT_TABLES = [p for p in glob.glob(os.path.join(ROOT, "runs", "reference", "*.md"))
                 if os.path.basename(p) not in ("audit.md", "secure_spread.md")]


def test_every_results_table_says_whether_its_noise_was_seeded():
    for path in RESULT_TABLES:
        text = open(path).read()
        assert "secure_rng=false" in text or "secure noise" in text, f"{os.path.basename(path)} does not say its noise"


def test_the_spread_script_finds_each_rows_number_in_its_table():
    for row in [*secure_spread.ROWS, secure_spread.GFA]:
        assert secure_spread.table_value(row) is not None, f"{row.name}: no '{row.table_row}' / '{row.table_col}'"


def test_the_spread_report_counts_a_table_number_outside_the_secure_range_as_a_defect():
    row = secure_spread.ROWS[0]
    table = secure_spread.table_value(row)
    results = {(row.name, s, False): table for s in row.table_seeds}
    results.update({(row.name, s, True): table - 100.0 - s for s in row.secure_seeds})  # all below the table
    text = secure_spread.report([row], results, wall=0.0)
    assert "**no**" in text
    results.update({(row.name, s, True): table + 10.0 * (s - 2) for s in row.secure_seeds})  # spans it
    assert "| yes |" in secure_spread.report([row], results, wall=0.0)
