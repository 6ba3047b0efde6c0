"""Server-rendered SVG charts (pure functions)."""
from datetime import datetime, timezone

from dashboard.charts import Series, line_chart, nice_max, short_number
from dashboard.selectors import RANGES, periods


def test_nice_max_and_numbers():
    assert [nice_max(v) for v in (0, 0.3, 1, 7, 12, 480, 5001)] == [1, 0.5, 1, 10, 20, 500, 10000]
    assert [short_number(v) for v in (0, 5, 2.5, 1500, 2_000_000)] == ["0", "5", "2.5", "1.5k", "2M"]


def test_gaps_break_lines_and_lone_points_are_drawn():
    svg = line_chart("c", "Tokens <all>", "tokens", ["a", "b", "c", "d"],
                     [Series("m1", [1.0, None, 3.0, 4.0]), Series("m<2>", [None, 2.0, None, None])])
    m1 = svg.split('data-series="m1"')[0].rsplit("<path", 1)[1]
    assert m1.count("M") == 2 and m1.count("L") == 1  # two pieces: [a] and [c, d]
    assert svg.count("<circle") == 2  # the lone points: m1 at a, m<2> at b
    assert "Tokens &lt;all&gt;" in svg and "m&lt;2&gt;" in svg and "<2>" not in svg
    assert 'role="img"' in svg and 'aria-labelledby="c-title c-desc"' in svg


def test_empty_chart_says_so():
    assert "no usage in this range" in line_chart("e", "Requests", "requests", [], [])


def test_periods_end_at_the_current_period():
    now = datetime(2026, 3, 10, 15, 42, tzinfo=timezone.utc)
    hours = periods(RANGES["24h"], now)
    assert len(hours) == 24 and hours[-1] == datetime(2026, 3, 10, 15, tzinfo=timezone.utc)
    days = periods(RANGES["30d"], now)
    assert len(days) == 30 and days[-1] == datetime(2026, 3, 10, tzinfo=timezone.utc)
    assert days[0] == datetime(2026, 2, 9, tzinfo=timezone.utc)
