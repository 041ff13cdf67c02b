"""The wire bytes and results of a fixed set of quantized allreduces (tests/algo/wire_cases.py)
are the ones recorded in tests/algo/data/wire_fixture.json: a refactoring changes neither. A
change that means to change the wire rewrites the fixture (python tests/algo/wire_cases.py
--record) and says why."""

import json

import wire_cases


def test_wire_bytes_and_results_match_the_fixture():
    with open(wire_cases.FIXTURE) as f:
        want = json.load(f)
    got = wire_cases.run_cases()
    assert sorted(got) == sorted(want), "the set of cases changed: re-record the fixture"
    changed = [f"{k}: {want[k]} -> {got[k]}" for k in want if got[k] != want[k]]
    assert not changed, f"{len(changed)} of {len(want)} cases changed:\n" + "\n".join(changed[:20])
    # every case moved bytes on every rank (a recorder that saw nothing would match trivially)
    assert all(r[-1] > 0 for ranks in got.values() for r in ranks)
