"""scripts/torch_suite/summary.py: how a run of torch's own tests on qnccl is added up. A failure
of an exact tensor comparison is tolerance; any other failure counts against qnccl unless it
fails on Gloo alone too; a run that quantized nothing fails."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY = os.path.join(ROOT, "scripts", "torch_suite", "summary.py")

CASES = """<testsuites><testsuite>
<testcase classname="test_x.T" name="test_ok"/>
<testcase classname="test_x.T" name="test_skip"><skipped/></testcase>
<testcase classname="test_x.T" name="test_close"><failure message="boom">
AssertionError: Tensor-likes are not close!</failure></testcase>
<testcase classname="test_x.T" name="test_hang"><failure message="Timeout">
RuntimeError: Process 1 terminated or timed out after 300 seconds</failure></testcase>
</testsuite></testsuites>"""


def _run(tmp_path, quantized=3, gloo=None):
    (tmp_path / "junit.xml").write_text(CASES)
    counts = {"all_gather": {"quantized_calls": quantized, "passthrough_calls": 1}}
    (tmp_path / "stats-1.json").write_text(json.dumps(counts))
    (tmp_path / "stats-2.json").write_text(json.dumps(counts))
    if gloo is not None:
        (tmp_path / "junit-gloo.xml").write_text(gloo)
    p = subprocess.run(
        [sys.executable, SUMMARY, str(tmp_path), "/x/test_x.py"], capture_output=True, text=True
    )
    return p.returncode, p.stdout


def test_an_other_failure_fails_the_run_and_is_listed_for_the_gloo_rerun(tmp_path):
    rc, out = _run(tmp_path)
    assert rc == 1, out
    assert "passed 1, skipped 1, tolerance 1, fails on Gloo too 0, other 1" in out, out
    assert "quantized      6   passed through      2" in out, out  # summed over processes
    assert (tmp_path / "others.txt").read_text() == "/x/test_x.py::T::test_hang\n"


def test_a_failure_gloo_shares_is_not_qnccls(tmp_path):
    gloo = CASES.split("<testcase")[0] + (
        '<testcase classname="test_x.T" name="test_hang"><failure message="x"/></testcase>'
        "</testsuite></testsuites>"
    )
    rc, out = _run(tmp_path, gloo=gloo)
    assert rc == 0, out
    assert "fails on Gloo too 1, other 0" in out, out


def test_nothing_quantized_fails(tmp_path):
    rc, out = _run(tmp_path, quantized=0, gloo=CASES)  # every failure shared with Gloo
    assert rc == 1 and "other 0" in out, out
