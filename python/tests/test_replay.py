"""A trace replayed by the Python example loop gives hkv simulate's numbers exactly."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import hybridkv
from conftest import model_path

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import continuous_batching  # noqa: E402

FIELDS = ("steps", "preemptions", "hit_rate", "hit_rate_incl_readmissions", "peak_blocks_used",
          "peak_running", "scheduled_tokens", "num_blocks")


def test_generated_trace_matches_the_cli_and_reads_back(tmp_path, hkv_bin):
    path = tmp_path / "py.jsonl"
    trace = hybridkv.generate_trace(requests=30, seed=3, session_gap=20, path=path)
    cli = tmp_path / "cli.jsonl"
    subprocess.run([hkv_bin, "trace", "gen", "--requests", "30", "--seed", "3",
                    "--session-gap", "20", "-o", str(cli)], check=True, capture_output=True)
    assert path.read_text() == cli.read_text()
    back = hybridkv.read_trace(path)
    assert len(back) == len(trace) == 30
    for a, b in zip(trace, back):
        assert a["id"] == b["id"] and a["arrival_step"] == b["arrival_step"]
        assert np.array_equal(a["prompt"], b["prompt"]) and a["prompt"].dtype == np.int32
        assert np.array_equal(a["output"], b["output"]) and len(a["output"]) == a["output_len"]
    assert any(t["turn"] > 0 for t in trace)
    with pytest.raises(hybridkv.NotFoundError):
        hybridkv.read_trace(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(hybridkv.Error) as e:
        hybridkv.read_trace(bad)
    assert "bad.jsonl" in str(e.value)
    with pytest.raises(hybridkv.InvalidArgumentError):
        hybridkv.generate_trace(requests=-1)


@pytest.mark.parametrize("model,memory,mode", [
    ("google--gemma-2-9b", "4GiB", "uniform"),
    ("google--gemma-2-9b", "4GiB", "padded"),
    ("google--gemma-2-9b", "4GiB", "hybridkv"),
    ("ibm-ai-platform--Bamba-9B", "3GiB", "hybridkv"),
    ("ibm-ai-platform--Bamba-9B", "3GiB", "padded"),
])
def test_python_replay_equals_hkv_simulate(tmp_path, hkv_bin, model, memory, mode):
    path = tmp_path / "trace.jsonl"
    trace = hybridkv.generate_trace(requests=60, seed=3, session_gap=20, path=path)
    out = subprocess.run([hkv_bin, "simulate", str(model_path(model)), "--trace", str(path),
                          "--memory", memory, "--allocator", mode, "--json"],
                         check=True, capture_output=True, text=True).stdout
    cli = json.loads(out)["runs"][0]
    alloc = hybridkv.make_allocator(hybridkv.load_model(model_path(model)), mode, memory=memory)
    py = continuous_batching.replay(trace, alloc.config)
    assert {k: py[k] for k in FIELDS} == {k: cli[k] for k in FIELDS}
    if model.startswith("google") and memory == "4GiB":
        assert py["preemptions"] > 0  # the comparison covers preemption and re-admission
