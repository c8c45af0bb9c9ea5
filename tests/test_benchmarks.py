"""The benchmark scripts are not tests, but they must keep running: each runs here once at toy sizes."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_throughput_runs_on_cpu_at_toy_sizes(tmp_path):
    out = tmp_path / "r.json"
    args = ["--device", "cpu", "--model", "tiny-gpt2", "--batch", "4", "--query-len", "8", "--response-len", "4",
            "--noptepochs", "1", "--updates", "1", "--warmup", "0", "--sampler-reps", "1", "--threads", "1",
            "--json", str(out)]  # fmt: skip
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_throughput.py"), *args], capture_output=True,
                       text=True, cwd=ROOT)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"] == "cpu" and res["batch"] == 4 and res["updates_timed"] == 1
    sec = res["seconds_per_update"]
    assert sec["total"] > 0 and all(sec[k] >= 0 for k in ("generation", "rollout_forward", "scoring", "optimization"))
    assert abs(sum(sec[k] for k in ("generation", "rollout_forward", "scoring", "optimization")) - sec["total"]) < 1e-6
    assert res["model_tflop_per_update"]["total"] > 0 and res["projected_1M_episodes_min"] > 0
    assert set(res["sampler_alone"]) == {"dynamic", "static", "hf_generate", "hf_generate_static"}
    assert "episodes/s" in r.stdout and "HF generate" in r.stdout
