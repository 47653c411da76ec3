"""examples/train_tiny.py on the GPU (issue 24, item 4): a two-layer Mamba LM trained on our kernels (the blocks, the
AdamW and the clipping) from a signed bundle (MF_RUNTIME_BUNDLE, MF_RUNTIME_KEY; else tests/gpu/test_runtime_gpu.py
builds and qualifies one).

- 20 steps twice in one process (--check-repro) and once more in a fresh process: the same loss curve and final
  parameters, bit for bit; the 20-step curve is the first 20 steps of the 200-step run's (step i's data and
  everything before it do not depend on --steps);
- 200 steps: the loss falls from about ln(32) to well under 3.04 nats, the best a model using one token of
  context can reach on this chain, so the Mamba blocks (their conv and scan) learned, not just the embedding.

    MF_RUNTIME_BUNDLE=dist/h200.tar.gz MF_RUNTIME_KEY=manifests/keys python -m pytest -q tests/gpu/test_train_tiny_gpu.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_runtime_gpu import bundle  # noqa: E402,F401  (module fixture: the signed bundle and its key)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_tiny.py"
ONE_TOKEN_CONTEXT = 3.04  # nats: H(next | previous token) of the seed-0, vocab-32 chain (examples/train_tiny.py)


def _train(bundle, tmp_path, name, *args):  # noqa: F811
    path, key = bundle
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, str(SCRIPT), "--bundle", str(path), "--key", str(key), "--out", str(out), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return json.loads(out.read_text()), res.stdout


@pytest.fixture(scope="module")
def short(bundle, tmp_path_factory):  # noqa: F811
    return _train(bundle, tmp_path_factory.mktemp("short"), "short", "--steps", "20", "--check-repro")


def test_twenty_steps_are_bit_identical_twice_and_across_processes(bundle, short, tmp_path):  # noqa: F811
    doc, stdout = short
    assert doc["repro"] is True and "repro: two runs gave the same 20 losses" in stdout
    assert len(doc["loss"]) == len(doc["loss_f32_hex"]) == 20 and all(math.isfinite(x) for x in doc["loss"])
    assert abs(doc["loss"][0] - math.log(32)) < 0.3, doc["loss"][0]
    assert doc["loss"][-1] < doc["loss"][0]
    again, _ = _train(bundle, tmp_path, "again", "--steps", "20")
    assert again["loss_f32_hex"] == doc["loss_f32_hex"] and again["params_sha256"] == doc["params_sha256"]


def test_two_hundred_steps_learn_the_chain(bundle, short, tmp_path):  # noqa: F811
    doc, stdout = _train(bundle, tmp_path, "full", "--steps", "200")
    loss = doc["loss"]
    assert len(loss) == 200 and all(math.isfinite(x) for x in loss)
    assert doc["loss_f32_hex"][:20] == short[0]["loss_f32_hex"], "a 20-step run is not the 200-step run's prefix"
    first, last = sum(loss[:20]) / 20, sum(loss[-20:]) / 20
    assert last < first - 1.0 and last < ONE_TOKEN_CONTEXT - 1.0, (first, last)
    assert "step   200/200" in stdout
