"""Run every ``benchmarks/bench_*.py`` in turn, each in its own interpreter.

    python benchmarks/run_all.py            # what ``make bench`` runs
    python benchmarks/run_all.py --quick    # passes --quick to each benchmark

Exits non-zero if any benchmark does (``bench_import.py`` does when the import is over
its budget or drags in a heavy package).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    failed: list[str] = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"## {script.name}\n", flush=True)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, str(script), *argv], check=False)
        print(f"\n({script.name}: {time.perf_counter() - started:.1f} s, exit {done.returncode})\n")
        if done.returncode != 0:
            failed.append(script.name)
    if failed:
        print("Failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
