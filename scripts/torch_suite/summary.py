"""Adds up a scripts/torch_suite.sh run: the stats-<pid>.json files its processes wrote (calls
quantized and passed through per collective) and its junit.xml (each failure classed as
"tolerance", a tensor comparison the codec's error fails, or "other"). The node ids of the other
failures go to others.txt, which the script reruns on Gloo alone (junit-gloo.xml); with that
file, an other failure that fails on Gloo too is "fails on Gloo too" (the test file and the
installed torch disagree, say), and only the rest count. Exit 1 when any failure is other than
tolerance and does not fail on Gloo too, or when nothing was quantized."""

import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

# what torch.testing's assertEqual says when two tensors (or numbers) differ in value
TOLERANCE = re.compile(r"(Tensor-likes|Scalars) are not (close|equal)!")


def _failed(root) -> dict:
    """{(class, test): the failure's text} of a junit tree."""
    bad = {}
    for case in root.iter("testcase"):
        f = case.find("failure")
        f = f if f is not None else case.find("error")
        if f is not None:
            bad[(case.get("classname"), case.get("name"))] = (f.get("message") or "") + (
                f.text or ""
            )
    return bad


def main(out: str, test_file: str) -> int:
    totals: dict = {}
    files = glob.glob(os.path.join(out, "stats-*.json"))
    for path in files:
        with open(path) as f:
            for name, counts in json.load(f).items():
                t = totals.setdefault(name, {"quantized_calls": 0, "passthrough_calls": 0})
                for k in t:
                    t[k] += counts.get(k, 0)
    print(f"[torch_suite] calls counted by {len(files)} processes (every rank counts its own):")
    for name, t in sorted(totals.items()):
        print(
            f"  {name:15s} quantized {t['quantized_calls']:6d}   passed through "
            f"{t['passthrough_calls']:6d}"
        )
    root = ET.parse(os.path.join(out, "junit.xml")).getroot()
    failed = _failed(root)
    gloo_path = os.path.join(out, "junit-gloo.xml")
    on_gloo = _failed(ET.parse(gloo_path).getroot()) if os.path.exists(gloo_path) else None
    kinds = {"passed": 0, "skipped": 0, "tolerance": 0, "fails on Gloo too": 0, "other": 0}
    others, ids = [], []
    for case in root.iter("testcase"):
        key = (case.get("classname"), case.get("name"))
        if key not in failed:
            kinds["skipped" if case.find("skipped") is not None else "passed"] += 1
            continue
        text = failed[key]
        if TOLERANCE.search(text):
            kinds["tolerance"] += 1
        elif on_gloo is not None and key in on_gloo:
            kinds["fails on Gloo too"] += 1
        else:
            kinds["other"] += 1
            last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["?"]
            others.append(f"{key[0]}.{key[1]}: {last[0][:200]}")
            ids.append(f"{test_file}::{key[0].rsplit('.', 1)[-1]}::{key[1]}")
    if on_gloo is None:
        with open(os.path.join(out, "others.txt"), "w") as f:
            f.write("".join(i + "\n" for i in ids))
    print("[torch_suite] tests: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    for line in others:
        print("  other failure: " + line)
    quantized = sum(t["quantized_calls"] for t in totals.values())
    return 1 if kinds["other"] or not quantized else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
