"""The composition's plans stay bit-identical to the ones it made before it was made faster:
digests of windows from 1 to 1,024 ranks (``plan_cases.py``) against saved fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.balance.plan_cases import CASES, case_name, plan_digest

DIGESTS = json.loads((Path(__file__).parent / "fixtures" / "compose_digests.json").read_text())


def test_every_case_has_a_saved_digest():
    assert sorted(DIGESTS) == sorted(case_name(case) for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=case_name)
def test_plan_is_bit_identical_to_the_saved_one(case):
    assert plan_digest(*case) == DIGESTS[case_name(case)]
