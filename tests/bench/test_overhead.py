"""``speclane bench overhead``: a short real run (upstream, speclane, load generator)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.bench import overhead


async def test_short_run_measures_both_stream_lengths_and_judges_the_targets() -> None:
    result = await overhead.run([1, 64], seconds=0.4, warmup=0.1, nginx="off", tokens=(7, 40),
                                rounds=2)
    rows = result["rows"]
    assert {(r["target"], r["concurrency"], r["tokens"]) for r in rows} == {
        (t, c, n) for t in ("direct", "speclane") for c in (1, 64) for n in (7, 40)}
    for r in rows:
        assert r["errors"] == 0 and r["requests"] > 0
        # role chunk + tokens + finish chunk + [DONE], every one relayed
        per_stream = r["tokens"] + 3
        assert r["chunks_per_s"] == pytest.approx(
            r["requests"] * per_stream / overhead_seconds(result), rel=0.5)
    plain = {(r["tokens"], r["plain_requests_per_s"] is not None) for r in rows}
    assert plain == {(7, True), (40, False)}
    targets = result["targets"]
    assert [(t["target"].split()[0], t["tokens"]) for t in targets] == [
        ("added", 7), ("relayed", 7), ("added", 40), ("relayed", 40)]
    table = overhead.render_table(result)
    assert "| speclane | 64 | 40 |" in table
    assert "target < 1 ms" in overhead.render_targets(targets)


def overhead_seconds(result: dict[str, object]) -> float:
    """Measured seconds per row: the rounds are pooled."""
    return float(result["seconds_per_level"]) * int(result["rounds"])  # type: ignore[arg-type]


def test_targets_are_judged_from_the_added_rows() -> None:
    result = {"added": [
        {"target": "speclane", "concurrency": 1, "tokens": 7, "added_ttft_p50_ms": 0.9,
         "chunks_vs_direct": 0.5},
        {"target": "speclane", "concurrency": 64, "tokens": 7, "added_ttft_p50_ms": 9.0,
         "chunks_vs_direct": 0.79},
        {"target": "speclane", "concurrency": 64, "tokens": 256, "added_ttft_p50_ms": 9.0,
         "chunks_vs_direct": 0.81},
        {"target": "nginx", "concurrency": 64, "tokens": 7, "added_ttft_p50_ms": 1.0,
         "chunks_vs_direct": 0.9},
    ]}
    assert [t["met"] for t in overhead.judge_targets(result)] == [True, False, True]


def test_main_prints_the_table_and_saves_json(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.json"
    assert overhead.main(["--concurrency", "1", "--tokens", "7", "--seconds", "0.3",
                          "--rounds", "1", "--warmup", "0.1", "--nginx", "off",
                          "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| direct | 1 | 7 |" in printed
    assert "added TTFT p50 at concurrency 1, 7-token streams" in printed
    assert out.exists()
