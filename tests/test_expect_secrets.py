"""--expect and --expect-file compare variables outside the watched set (a token, a password) but never
show their values: not the live one, not the expected one, in text or JSON."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

SECRETS = ("hf_live_value_123", "hf_expected_value_456", "file_password_789", "live_password_000")


def test_expectations_on_secret_variables_say_differs_never_the_values(tmp_path):
    env = {**os.environ, "HF_TOKEN": SECRETS[0], "DB_PASSWORD": SECRETS[3], "NCCL_PROTO": "Simple"}
    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); "
                              "time.sleep(60)"], env=env)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        envfile = tmp_path / "expected.env"
        envfile.write_text(f"DB_PASSWORD={SECRETS[2]}\n")
        args = [sys.executable, "-m", "ncclprobe", "inspect", str(child.pid), "--scope", "all",
                "--expect", f"HF_TOKEN={SECRETS[1]}", "--expect", "NCCL_PROTO=LL", "--expect-file", str(envfile)]
        text = subprocess.run(args, capture_output=True, text=True, timeout=120)
        js = subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=120)
    finally:
        child.kill()
        child.wait()
    for r in (text, js):
        assert r.returncode == 1, r.stderr
        assert not any(s in r.stdout + r.stderr for s in SECRETS), "a secret value was shown"
    out = json.loads(js.stdout)
    # one cause (the root was started with these values), every variable named
    [changed] = [f for f in out["findings"] if f["code"] == "ENV_CHANGED"]
    assert set(changed["vars"]) == {"HF_TOKEN", "DB_PASSWORD", "NCCL_PROTO"}
    assert "HF_TOKEN differs from the expected value" in changed["message"]
    assert "NCCL_PROTO='Simple' (expected 'LL')" in changed["message"]  # a watched value is shown as it is
    assert changed["evidence"]["vars"]["HF_TOKEN"] == {"expected": "<not shown: outside the watched set>",
                                                       "value": "<not shown: outside the watched set>"}
    assert out["expect"]["HF_TOKEN"] == "<redacted>" and out["expect"]["NCCL_PROTO"] == "LL"
