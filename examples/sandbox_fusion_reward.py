#!/usr/bin/env python3
"""A verl-style code reward pointed at a dsec fleet through its SandboxFusion-compatible POST /run_code.

verl's sandbox_fusion reward (and other RL stacks) POST {"code", "language", "stdin", "compile_timeout",
"run_timeout", "memory_limit_MB", "files", "fetch_files"} to `<url>/run_code` and score from `run_result`. The
same code works against dsec unchanged: give it the fleet's URL (a node or a gateway) and, on the API's own
listener, the fleet token; or the address of a `--run-code-listen` / `--gateway-run-code-listen` listener, which
needs no token (bind that to a private address: docs/security.md).

    compute_score(data_source, solution_str, ground_truth, extra_info) -> float   (verl's reward signature)

ground_truth is {"inputs": [...], "outputs": [...]} (stdin / expected stdout per test case, as in verl's code
datasets); the score is the fraction of cases whose stdout matches. Run this file to score a few candidate
programs against a running fleet:

    dsec serve &                                                  # or a Slurm fleet (slurm-configs/README.md)
    /usr/bin/python3 examples/sandbox_fusion_reward.py [--fleet default] [--url URL] [--token TOKEN]

The fleet's URL and token come from ~/.dsec/fleets/NAME.json (what `dsec serve` and dsec-launch write) unless
--url / --token or $SANDBOX_FUSION_URL / $DSEC_TOKEN say otherwise. Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import sys
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Tuple

SANDBOX_FUSION_URL = os.environ.get("SANDBOX_FUSION_URL", "")  # "http://10.0.0.5:8471" (no /run_code)
TOKEN = os.environ.get("DSEC_TOKEN", "")  # only for the API's own (authenticated) listener
TIMEOUT = 10  # compile and run, seconds
MEMORY_MB = 1024


def call_run_code(url: str, code: str, language: str, stdin: str, token: str = "") -> Tuple[Optional[dict], str]:
    """One POST /run_code, as verl's call_sandbox_api sends it. (answer, "") or (None, error)."""
    payload = {"compile_timeout": TIMEOUT, "run_timeout": TIMEOUT, "memory_limit_MB": MEMORY_MB, "code": code,
               "stdin": stdin, "language": language, "files": {}, "fetch_files": []}
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url.rstrip("/") + "/run_code", data=json.dumps(payload).encode(), headers=headers,
                                 method="POST")
    try:
        with urllib.request.urlopen(req, timeout=2 * TIMEOUT + 30) as r:
            return json.load(r), ""
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        return None, f"HTTP {e.code}: {body[:300]}"
    except (OSError, ValueError) as e:
        return None, f"request failed: {e}"


def extract_code(solution_str: str) -> Tuple[str, str]:
    """The last fenced code block of a model's answer and its language (python when unnamed)."""
    blocks = re.findall(r"```(\w*)\n(.*?)```", solution_str, re.S)
    if not blocks:
        return solution_str, "python"
    lang, code = blocks[-1]
    lang = {"py": "python", "python3": "python", "sh": "bash", "c++": "cpp", "": "python"}.get(lang.lower(), lang)
    return code, lang


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Optional[dict] = None,
                  url: str = "", token: str = "") -> float:
    """verl's reward function signature: the fraction of test cases passed (a failed request scores 0)."""
    url = url or SANDBOX_FUSION_URL
    token = token or TOKEN
    cases = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    code, language = extract_code(solution_str)
    passed = 0
    for stdin, expected in zip(cases["inputs"], cases["outputs"]):
        answer, error = call_run_code(url, code, language, stdin, token)
        if answer is None or answer.get("status") != "Success":
            continue  # SandboxError, compile error, runtime error or time limit: no credit
        if (answer["run_result"]["stdout"] or "").rstrip("\n") == str(expected).rstrip("\n"):
            passed += 1
    return passed / max(1, len(cases["inputs"]))


# ---- a small demo: candidate answers with known scores ----------------------------------------------------------
CASES = {"inputs": ["1 2\n", "40 2\n", "-5 5\n"], "outputs": ["3", "42", "0"]}
CANDIDATES: List[Tuple[str, str, float]] = [
    ("python, right", "```python\na, b = map(int, input().split())\nprint(a + b)\n```", 1.0),
    ("python, wrong sign", "```python\na, b = map(int, input().split())\nprint(abs(a) + b)\n```", 2 / 3),
    ("python, crashes", "```python\nprint(1 / 0)\n```", 0.0),
    ("bash, right", "```bash\nread a b\necho $((a + b))\n```", 1.0),
    ("cpp, right", "```cpp\n#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
                   "std::cout << a + b << '\\n'; }\n```", 1.0),
    ("cpp, compile error", "```cpp\nint main() { return x; }\n```", 0.0),
    ("python, too slow", "```python\nwhile True: pass\n```", 0.0),
]


def fleet_target(fleet: str) -> Tuple[str, str]:
    path = os.path.join(os.path.expanduser("~"), ".dsec", "fleets", f"{fleet}.json")
    with open(path) as f:
        doc: Dict[str, Any] = json.load(f)
    return doc["endpoint"], doc.get("token", "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", default=os.environ.get("DSEC_FLEET", "default"))
    ap.add_argument("--url", default=SANDBOX_FUSION_URL, help="node or gateway URL (default: the fleet file's)")
    ap.add_argument("--token", default=TOKEN, help="fleet token (default: the fleet file's; none for an open listener)")
    args = ap.parse_args()
    url, token = args.url, args.token
    if not url:
        url, file_token = fleet_target(args.fleet)
        token = token or file_token
    wrong = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        scores = list(pool.map(lambda c: compute_score("demo", c[1], CASES, url=url, token=token), CANDIDATES))
    for (name, _, want), got in zip(CANDIDATES, scores):
        ok = abs(got - want) < 1e-9
        wrong += not ok
        print(f"{name:22s} score {got:.3f} (expected {want:.3f}){'' if ok else '  MISMATCH'}")
    print(f"sandbox_fusion_reward: {len(CANDIDATES)} candidates, {wrong} mismatches, via {url}/run_code")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
