"""The soak (test/soak.py) for three minutes, in its own process: 8 threads, three models, changing
shapes, reloads; no wrong result, no error, resident memory levelling off.

The hour-long run (python test/soak.py --minutes 60) holds the slope to 1 MB a minute. Three
minutes hold it to 3: in the first minutes glibc's per-thread heaps are still growing to their
working size (measured here: heap in use flat, arenas growing 12, 6, 2, 2 MB in successive rounds
of the same work), while a leak of a few hundred bytes per call (over 150,000 calls here) would
show as tens of MB a minute.
"""
import json
import os
import subprocess
import sys

SOAK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak.py")


def test_three_minutes_of_mixed_traffic(tmp_path):
    result = tmp_path / "soak.json"
    run = subprocess.run([sys.executable, SOAK, "--minutes", "3", "--max-slope", "3", "--json", str(result)],
                         capture_output=True, text=True, timeout=600)
    assert result.exists(), run.stderr[-3000:]
    soak = json.loads(result.read_text())
    assert soak["wrong"] == 0 and soak["errors"] == 0, run.stderr[-3000:]
    assert soak["calls"] > 1000 and soak["executions"] > soak["calls"]  # fused, every model
    assert soak["reloads"] >= 5 and soak["kernel_fallbacks"] == 0 and soak["stats_consistent"]
    assert soak["slope_mb_per_min"] <= 3, soak
    assert run.returncode == 0, run.stderr[-3000:]
