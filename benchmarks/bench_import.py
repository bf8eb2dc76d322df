"""What ``import llm_resilience`` costs in a fresh interpreter, and what it drags in.

Three measurements, each in its own fresh interpreter, ``RUNS`` times (median reported),
the import runs interleaved with bare interpreter starts so load drift hits both:

* ``perf_counter`` around ``import llm_resilience`` inside the child (start-up excluded
  by construction), then around resolving ``FallbackChain`` and every name in
  ``__all__`` (the core's names load lazily on first use);
* wall time of ``python -c "import llm_resilience"`` minus that of ``python -c "pass"``;
* one ``-X importtime`` run, for the cumulative figure Python itself reports.

Children run with bytecode caching on, in a cache directory outside the source tree
(``PYTHONPYCACHEPREFIX``), after a warm-up run: an installed package has its ``.pyc``
files, and compiling sources on every start is not what users pay.

It also reports, after the import and again after every public name was resolved,
which of the heavy packages (langchain*, llama_index*, sqlalchemy*, sqlmodel*, pandas*,
redis*) ended up in ``sys.modules``: the contract says none may.

    python benchmarks/bench_import.py           # 15 runs, ~6 s on 2 cores
    python benchmarks/bench_import.py --quick   # 5 runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

RUNS = 15
GOAL_MS = 100.0
HEAVY = ("langchain", "llama_index", "sqlalchemy", "sqlmodel", "pandas", "redis")

# Runs in the child; prints one JSON line. Heavy modules are listed by top-level name.
_PROBE = f"""
import json, sys, time
heavy = {HEAVY!r}
def loaded():
    names = {{name.partition(".")[0] for name in sys.modules}}
    return sorted(name for name in names if name.startswith(heavy))
before = set(sys.modules)
t0 = time.perf_counter_ns()
import llm_resilience
t1 = time.perf_counter_ns()
after_import = loaded()
new_modules = len(set(sys.modules) - before)
from llm_resilience import FallbackChain
t2 = time.perf_counter_ns()
# Every name but the two whose whole point is a heavy backend (they load SQLAlchemy and
# redis on first use, by design).
for name in llm_resilience.__all__:
    if name not in ("SqlCostLedger", "RedisTokenBucketRateLimiter"):
        getattr(llm_resilience, name)
t3 = time.perf_counter_ns()
print(json.dumps({{
    "import_ns": t1 - t0, "fallback_ns": t2 - t1, "all_ns": t3 - t2,
    "heavy_after_import": after_import, "heavy_after_all": loaded(),
    "new_modules": new_modules,
}}))
"""


def _child_env(cache: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = cache
    return env


def _wall_ns(args: list[str], env: dict[str, str]) -> int:
    start = time.perf_counter_ns()
    subprocess.run([sys.executable, *args], env=env, check=True, capture_output=True)
    return time.perf_counter_ns() - start


def _probe(env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _importtime_us(env: dict[str, str]) -> int:
    """Cumulative microseconds ``-X importtime`` reports for ``llm_resilience``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import llm_resilience"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    for line in done.stderr.splitlines():
        # "import time:  self [us] | cumulative | imported package"
        parts = [part.strip() for part in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == "llm_resilience":
            return int(parts[1])
    raise RuntimeError("-X importtime did not report llm_resilience")


def _ms(values: list[int]) -> float:
    return statistics.median(values) / 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help=f"5 runs instead of {RUNS}")
    args = parser.parse_args(argv)
    runs = 5 if args.quick else RUNS
    with tempfile.TemporaryDirectory(prefix="bench-pycache-") as cache:
        env = _child_env(cache)
        # Warm-up: fills the bytecode cache and the OS file cache.
        _probe(env)
        _wall_ns(["-c", "pass"], env)
        probes, bare, imported = [], [], []
        for _ in range(runs):
            probes.append(_probe(env))
            bare.append(_wall_ns(["-c", "pass"], env))
            imported.append(_wall_ns(["-c", "import llm_resilience"], env))
        importtime_ms = _importtime_us(env) / 1000

    import_ms = _ms([int(p["import_ns"]) for p in probes])  # type: ignore[call-overload]
    fallback_ms = _ms([int(p["fallback_ns"]) for p in probes])  # type: ignore[call-overload]
    all_ms = _ms([int(p["all_ns"]) for p in probes])  # type: ignore[call-overload]
    delta_ms = statistics.median(i - b for i, b in zip(imported, bare, strict=True)) / 1e6
    heavy_import = sorted({name for p in probes for name in p["heavy_after_import"]})  # type: ignore[attr-defined]
    heavy_all = sorted({name for p in probes for name in p["heavy_after_all"]})  # type: ignore[attr-defined]
    verdict = "PASS" if import_ms < GOAL_MS and delta_ms < GOAL_MS else "FAIL"

    print(
        f"Machine: Python {platform.python_version()}, {os.cpu_count()} CPU(s), "
        f"{platform.machine()} {platform.system()}; load average "
        + " ".join(f"{value:.1f}" for value in os.getloadavg())
    )
    print()
    print(f"| measurement (median of {runs} fresh interpreters) | ms |")
    print("| --- | ---: |")
    print(f"| `import llm_resilience`, perf_counter in the child | {import_ms:.2f} |")
    print(f"| then `from llm_resilience import FallbackChain` | {fallback_ms:.2f} |")
    print(f"| then every other name in `__all__` (but the SQL and Redis backends) | {all_ms:.2f} |")
    print(f"| bare interpreter start (`-c pass`), wall | {_ms(bare):.1f} |")
    print(f"| `-c 'import llm_resilience'`, wall | {_ms(imported):.1f} |")
    print(f"| import cost = wall difference, paired per run | {delta_ms:.1f} |")
    print(f"| `-X importtime` cumulative for `llm_resilience` (one run) | {importtime_ms:.2f} |")
    print()
    print(f"Modules newly loaded by the import: {probes[0]['new_modules']}.")
    print(f"Goal: import < {GOAL_MS:.0f} ms: {verdict}.")
    print(f"Heavy packages in sys.modules after the import: {', '.join(heavy_import) or 'none'}.")
    print(
        "... after resolving every public name but SqlCostLedger and "
        f"RedisTokenBucketRateLimiter: {', '.join(heavy_all) or 'none'}."
    )
    if heavy_import or heavy_all:
        print("FAIL: the core must not import " + ", ".join(f"{h}*" for h in HEAVY) + ".")
    return 0 if verdict == "PASS" and not heavy_import and not heavy_all else 1


if __name__ == "__main__":
    sys.exit(main())
