"""The oneDNN quirk registry (onednn_quirks.cpp, read through torch_llga._C._quirks()).

Always: its rows are well formed, every regression test it names exists, an unknown name in
TORCH_LLGA_QUIRKS_OFF warns, and a quirk fixed in this oneDNN is off here.

With TORCH_LLGA_QUIRK_TEST=1 (test_workaround_off, one case a row; a few minutes): each row's
regression tests run in a child process with its workaround off (TORCH_LLGA_QUIRKS_OFF=<name>),
and the case reports what they show on this oneDNN and CPU:
  still needed on oneDNN X   they fail (or the child crashes) with the workaround off;
  fixed on this oneDNN       they pass with it off (the row may get this version as fixed_in);
  not reproduced on this CPU they pass, but the fault was seen in kernels this CPU never runs;
  not reached on this CPU    they skip here (bf16 kernels, VNNI, ...);
  fixed in X (registered)    the row says the fault is gone here, and the tests agree.
The case passes either way (the suite's normal run covers the workaround on), and fails where a
row marked fixed on this version still fails with its workaround off, or names no test. The table
is printed at the end of the session; TORCH_LLGA_QUIRK_REPORT=path also writes it as JSON.

    TORCH_LLGA_QUIRK_TEST=1 python -m pytest -q test/test_quirks.py [-k name]
    python test/test_quirks.py report.json [...]   # docs/quirks.md's table from such reports
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch

if __name__ == "__main__":  # python test/test_quirks.py: this checkout's torch_llga
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_llga  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIRKS = torch_llga._C._quirks()
CONFIG = torch_llga.config()
ONEDNN = torch_llga.onednn_version()
RUN_OFF = os.environ.get("TORCH_LLGA_QUIRK_TEST") == "1"


def release(version):
    return tuple(int(p) for p in version.split("."))


def fixed_here(q):
    return q["fixed_in"] is not None and release(ONEDNN) >= release(q["fixed_in"])


def runs_kernels(kernels):
    """Whether oneDNN runs kernels of this kind on this CPU ("avx2": AVX-512 CPUs run others)."""
    if kernels == "bf16":
        return CONFIG["bf16_kernels"]
    return kernels in CONFIG["cpu_isa"]


def child_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH_LLGA_QUIRKS_OFF", "TORCH_LLGA_QUIRK_TEST", "TORCH_LLGA_QUIRK_REPORT")}
    return {**env, **extra}


def test_registry_rows_are_well_formed():
    names = [q["name"] for q in QUIRKS]
    assert len(names) == len(set(names))
    for q in QUIRKS:
        assert re.fullmatch(r"[a-z0-9_]+", q["name"]), q
        assert q["fault"].endswith(".") and q["fault"][0].isupper(), q  # one sentence
        assert q["seen_on"] and q["test"] and q["asked_in"], q
        for v in q["seen_on"] + ([q["fixed_in"]] if q["fixed_in"] else []):
            assert re.fullmatch(r"\d+\.\d+(\.\d+)?", v), q
        if q["fixed_in"]:
            assert all(release(v) < release(q["fixed_in"]) for v in q["seen_on"]), q
        assert q["kernels"] in (None, "avx2", "avx512", "bf16"), q
        for t in q["test"]:
            assert t.startswith("test/") and "::" in t, q


def test_a_quirk_fixed_in_this_onednn_is_off_here():
    assert [q["name"] for q in QUIRKS if q["active_here"] == fixed_here(q)] == []
    assert torch_llga._C._quirk_active(QUIRKS[0]["name"]) == QUIRKS[0]["active_here"]
    with pytest.raises(RuntimeError, match="no quirk named"):
        torch_llga._C._quirk_active("no_such_quirk")


def test_every_regression_test_exists():
    tests = sorted({t for q in QUIRKS for t in q["test"]})
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *tests],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_unknown_names_in_quirks_off_warn():
    name = next(q["name"] for q in QUIRKS if not fixed_here(q))
    code = f"import torch_llga; print(torch_llga._C._quirk_active({name!r}))"
    out = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True,
                         env=child_env(TORCH_LLGA_QUIRKS_OFF=f"{name}, no_such_quirk"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "False"  # the known name is still switched off
    warning = [line for line in out.stderr.splitlines() if "TORCH_LLGA_QUIRKS_OFF" in line]
    assert warning and "'no_such_quirk'" in warning[0] and name in warning[0], out.stderr[-3000:]
    assert all(q["name"] in warning[0] for q in QUIRKS)  # the valid names


# --- each workaround off (TORCH_LLGA_QUIRK_TEST=1) ---

RESULTS = []


@pytest.fixture(scope="module")
def report(request):
    yield RESULTS
    if not RESULTS:
        return
    head = (f"oneDNN {ONEDNN} (torch {torch.__version__}), CPU {CONFIG['cpu_isa']}: "
            "each workaround off, its regression tests")
    width = max(len(r["name"]) for r in RESULTS)
    lines = [head] + [f"  {r['name']:<{width}}  {r['status']}  ({r['seconds']:.0f} s)" for r in RESULTS]
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():  # shown without -s too
        print("\n" + "\n".join(lines))
    path = os.environ.get("TORCH_LLGA_QUIRK_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"onednn": ONEDNN, "torch": torch.__version__, "cpu_isa": CONFIG["cpu_isa"],
                       "quirks": RESULTS}, f, indent=1)


def outcome(proc):
    """passed / skipped / failed / crashed / missing, from a pytest child's exit and last line."""
    if proc.returncode < 0 or proc.returncode > 5:
        return "crashed"  # a signal (a segfault: -11), or an abort through the shell's 128 + n
    if proc.returncode in (2, 3, 4, 5):
        return "missing"  # collection error, usage error (no such test), nothing collected
    if proc.returncode == 1:
        return "failed"
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return "passed" if " passed" in summary else "skipped"


@pytest.mark.skipif(not RUN_OFF, reason="each workaround off: TORCH_LLGA_QUIRK_TEST=1 (a few minutes)")
@pytest.mark.parametrize("quirk", QUIRKS, ids=[q["name"] for q in QUIRKS])
def test_workaround_off(quirk, report):
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *quirk["test"]]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=child_env(TORCH_LLGA_QUIRKS_OFF=quirk["name"]),
                              capture_output=True, text=True, timeout=900)
        result = outcome(proc)
    except subprocess.TimeoutExpired as e:
        proc, result = e, "crashed"  # a hang is as good a symptom as a crash
    isa = CONFIG["cpu_isa"]
    if result in ("failed", "crashed"):
        status = f"still needed on oneDNN {ONEDNN}" + (" (crash)" if result == "crashed" else "")
    elif result == "skipped":
        status = f"not reached on this CPU ({isa})"
    elif result == "passed" and fixed_here(quirk):
        status = f"fixed in {quirk['fixed_in']} (registered)"
    elif result == "passed" and quirk["kernels"] and not runs_kernels(quirk["kernels"]):
        status = f"not reproduced on this CPU ({isa})"
    elif result == "passed":
        status = "fixed on this oneDNN"
    else:
        status = "regression test missing"
    RESULTS.append({"name": quirk["name"], "status": status, "outcome": result, "seen_on": quirk["seen_on"],
                    "fixed_in": quirk["fixed_in"], "test": quirk["test"], "seconds": time.monotonic() - start})
    output = ((proc.stdout or "")[-3000:] + (proc.stderr or "")[-2000:]) if isinstance(proc.stdout, str) else ""
    assert result != "missing", f"{quirk['name']}: its regression tests do not run: {' '.join(quirk['test'])}\n{output}"
    assert not (fixed_here(quirk) and result in ("failed", "crashed")), \
        f"{quirk['name']} is registered fixed in {quirk['fixed_in']}, but its tests fail here with it off:\n{output}"


def markdown(reports):
    """docs/quirks.md's table: the registry's rows beside the status each report (a JSON file of
    TORCH_LLGA_QUIRK_REPORT) found."""
    runs = [json.load(open(p)) for p in reports]
    status = [{r["name"]: r["status"] for r in run["quirks"]} for run in runs]
    short = {"still needed": "needed", "fixed on this oneDNN": "fixed here", "not reproduced on this CPU": "not reproduced here",
             "not reached on this CPU": "not reached here", "fixed in": "fixed (registered)"}

    def shorten(s):
        return next((v for k, v in short.items() if s.startswith(k)), s) + (" (crash)" if s.endswith("(crash)") else "")

    head = ["quirk", "fault", "seen on", "fixed in"] + [f"oneDNN {run['onednn']}" for run in runs] + ["regression test"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for q in QUIRKS:
        tests = ", ".join(f"`{t.split('/', 1)[1]}`" for t in q["test"])
        fault = q["fault"] + (f" ({q['kernels']} kernels)" if q["kernels"] else "")
        cells = [f"`{q['name']}`", fault, " ".join(q["seen_on"]), q["fixed_in"] or ""]
        cells += [shorten(s.get(q["name"], "")) for s in status] + [tests]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown(sys.argv[1:]))
