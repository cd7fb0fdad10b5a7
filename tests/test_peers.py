"""benchmarks/peers.py without the peers installed: every peer is a reason string, nothing raises."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

PEERS = Path(__file__).resolve().parents[1] / "benchmarks" / "peers.py"


def load_peers(monkeypatch, tmp_path):
    monkeypatch.setenv("TKC_PEERS_DIR", str(tmp_path / "none"))
    monkeypatch.setenv("TKC_PEERS_SITE", str(tmp_path / "no_site"))
    spec = importlib.util.spec_from_file_location("peers_under_test", PEERS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_missing_peers_are_reasons(monkeypatch, tmp_path):
    peers = load_peers(monkeypatch, tmp_path)
    q = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    got = peers.attention(q, q, q, causal=False, scale=0.125)
    assert set(got) == {"FlashAttention-4", "TileLang", "cuTile"}
    a = torch.randn(64, 64, dtype=torch.bfloat16)
    got_gemm = peers.gemm(a, a)
    assert set(got_gemm) == {"TileLang", "cuTile"}
    for reason in [*got.values(), *got_gemm.values()]:
        assert isinstance(reason, str) and reason and len(reason) <= peers.REASON_CHARS


def test_tilelang_refuses_other_scales(monkeypatch, tmp_path):
    peers = load_peers(monkeypatch, tmp_path)
    q = torch.randn(1, 2, 128, 64, dtype=torch.bfloat16)
    assert "1/sqrt(D)" in peers.attention(q, q, q, causal=True, scale=0.5)["TileLang"]
