"""`opgym bench` end to end on a short run: what it writes, not how fast anything is (speed is
shown by the benchmark itself, never asserted by a test)."""
import csv
import json

import pytest

torch = pytest.importorskip("torch")


def test_quick_bench_writes_a_consistent_report(tmp_path, capsys):
    from opgym import cli

    impls = "copy,opgym,opgym_out,opgym_cpp,opgym_dispatch,hf_eager"
    code = cli.main(["bench", "--quick", "--cases", "../cases/qwen2_5_vl_3b/rms_norm.json", "--threads", "1",
                     "--impls", impls, "--samples", "2", "--sample-ms", "1", "--out-dir", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "bench.json").read_text())
    cases = json.loads(open("../cases/qwen2_5_vl_3b/rms_norm.json").read())["test_cases"]
    # every captured shape and the quick sweep, once each at one thread
    assert [r["label"] for r in rows[:len(cases)]] == [c["id"] for c in cases]
    assert [r["shape"] for r in rows[len(cases):]] == [[1, 2048], [64, 2048], [1024, 2048]]
    for r in rows:
        assert r["threads"] == 1
        assert r["bytes"] == 2 * 2 * r["shape"][0] * (r["shape"][1] if len(r["shape"]) == 2 else r["shape"][1] * r["shape"][2])
        for name in impls.split(","):
            us = r[name + "_us"]
            assert us > 0
            assert r[name + "_gbs"] == pytest.approx(r["bytes"] / (us * 1e-6) / 1e9)
            assert r[name + "_pct_copy"] == pytest.approx(100 * r["copy_us"] / us)
        assert r["speedup_vs_hf_eager"] == pytest.approx(r["hf_eager_us"] / r["opgym_us"])
    with open(tmp_path / "bench.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) and float(table[0]["opgym_us"]) == pytest.approx(rows[0]["opgym_us"])
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "RMSNorm: microseconds per call" in out and "bench.png" in out


@pytest.mark.parametrize("args,word", [
    (["--threads", "zero"], "--threads"),
    (["--threads", "0"], "--threads"),
    (["--impls", "opgym,nope"], "nope"),
    (["--samples", "0"], "--samples"),
])
def test_bench_bad_arguments_get_one_line(tmp_path, capsys, args, word):
    from opgym import cli

    assert cli.main(["bench", *args, "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert word in err and err.strip().count("\n") == 0
    assert not (tmp_path / "bench.json").exists()


def test_quick_bench_add_rms_norm(tmp_path, capsys):
    """--op add_rms_norm: its own peers, four tensors' bytes per element (x, residual in; out, sum out)."""
    from opgym import cli

    impls = "copy,opgym,opgym_inplace,hf_eager,F.rms_norm"
    code = cli.main(["bench", "--op", "add_rms_norm", "--quick", "--cases", "../cases/qwen2_5_vl_3b/add_rms_norm.json",
                     "--threads", "1", "--impls", impls, "--samples", "2", "--sample-ms", "1",
                     "--out-dir", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "bench.json").read_text())
    cases = json.loads(open("../cases/qwen2_5_vl_3b/add_rms_norm.json").read())["test_cases"]
    assert [r["label"] for r in rows[:len(cases)]] == [c["id"] for c in cases]
    for r in rows:
        n = 1
        for d in r["shape"]:
            n *= d
        assert r["bytes"] == 4 * 2 * n
        assert r["speedup_vs_hf_eager"] == pytest.approx(r["hf_eager_us"] / r["opgym_us"])
    assert "residual add + RMSNorm: microseconds per call" in capsys.readouterr().out
    assert cli.main(["bench", "--op", "add_rms_norm", "--impls", "opgym_cpp", "--out-dir", str(tmp_path / "x")]) == 2
