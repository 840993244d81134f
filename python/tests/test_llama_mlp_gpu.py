"""examples/llama_mlp.py on two GPUs: the tensor-parallel block's output and every gradient against the
same block run on whole fp32 tensors, for each algorithm."""

import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the torch ops are not tested here")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
import llama_mlp  # noqa: E402
from multiprocess import run_ranks  # noqa: E402


def _all_algorithms(rank, world):
    for algorithm in ("sequential", "pipelined", "fused", "auto"):
        errors = llama_mlp.check(rank, world, algorithm=algorithm)
        assert max(errors.values()) < 2e-2, f"rank {rank} {algorithm}: {errors}"


def test_llama_mlp_matches_the_single_gpu_reference_forward_and_backward():
    run_ranks(2, _all_algorithms)
