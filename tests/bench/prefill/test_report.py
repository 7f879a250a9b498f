"""``speclane bench prefill``'s table, from synthetic records."""

from __future__ import annotations

from router.bench.prefill import report

RESULTS = {
    "date": "2026-12-01T23:00:00Z",
    "commit": "abc1234",
    "model": "m",
    "environment": {"load_average_before": [7.0], "load_average_after": [8.0]},
    "targets": {
        "speclane": [
            {
                "step": "after-restart",
                "restarted_before": True,
                "prompt_tokens": 2651,
                "cached_tokens": 2633,
                "prefilled_tokens": 18,
                "ideal_new_tokens": 12,
                "ttft_s": 0.91,
            }
        ],
        "mlx_lm.server": [{"error": "RuntimeError: did not start"}],
    },
}


def test_each_request_is_a_row_and_a_failed_target_says_so() -> None:
    rows = report.rows(RESULTS)
    assert rows[0] == [
        "speclane",
        "after-restart (restarted)",
        "2,651",
        "2,633",
        "18",
        "12",
        "0.91",
    ]
    assert rows[1][:2] == ["mlx_lm.server", "(failed)"]
    text = report.render(RESULTS)
    assert "after-restart (restarted)" in text and "did not start" in text
    md = report.markdown(RESULTS)
    assert "commit abc1234" in md and "| speclane | after-restart (restarted) | 2,651 |" in md
