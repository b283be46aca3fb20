"""The table of verdicts over the project's own launcher examples (examples/), for a closing note or a
review: each case under `run`, plain `inspect` and `inspect --live`, driven exactly as
tests/test_launchers.py drives them (the same harness: workers held until read), with ncclprobe's exit
code, the error findings about NCCL_PROTO (code, edge kind, processes), whether they are exactly the
workers that lacked the value, and the first hint.

    python tests/verdict_table.py [--only SUBSTRING] [--drives run,inspect,inspect-live] [--width N]

Not a test (pytest does not collect it): the tests assert these verdicts; this prints them.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_launchers as tl  # noqa: E402


def _daemon(work: Path) -> str | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    dest = work / "daemon"
    subprocess.run([cc, "-O1", "-o", str(dest), str(tl.EXAMPLES / "c_daemon" / "daemon.c")], check=True)
    return str(dest)


def _row(o: tl.Outcome) -> list[str]:
    doc = o.doc or {"findings": []}
    errs = tl.errors_on_var(doc)
    flagged = tl.flagged(doc)
    right = "yes" if flagged == o.bad else f"no (flagged {sorted(flagged)}, lacked {sorted(o.bad)})"
    codes = ",".join(sorted({f["code"] for f in errs})) or "-"
    edges = ",".join(sorted({str((f.get("edge") or {}).get("kind")) for f in errs})) or "-"
    hint = next((f.get("hint") for f in errs if f.get("hint")), "") or ""
    unchecked = tl.reported_not_checked(doc)
    if unchecked:
        codes += f" (not checked: {len(unchecked)})"
    return [o.case.id, o.drive, str(o.rc), codes, edges, right, " ".join(hint.split())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--drives", default=",".join(tl.DRIVES))
    ap.add_argument("--width", type=int, default=110, help="hint column cut at this many characters")
    args = ap.parse_args()
    drives = args.drives.split(",")
    print("| case | drive | rc | error findings on NCCL_PROTO | edge | exactly the affected | hint |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        daemon = _daemon(work)
        for case in tl.CASES:
            if args.only not in case.id:
                continue
            for drive in drives:
                if case.needs_cc and daemon is None:
                    continue
                w = Path(tempfile.mkdtemp(dir=tmp))
                try:
                    row = _row(tl.drive_case(case, drive, w, daemon))
                except Exception as exc:  # noqa: BLE001 (a harness failure is a row too)
                    row = [case.id, drive, "-", f"harness: {str(exc).splitlines()[0][:60]}", "-", "-", ""]
                row[-1] = row[-1][:args.width]
                print("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
