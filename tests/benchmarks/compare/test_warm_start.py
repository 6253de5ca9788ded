"""The warm-start benchmark's summary and table: medians over every timed
call of every process, the speedup as the earlier tree's time over this
one's."""

from __future__ import annotations

from benchmarks.compare import warm_start


def one(times, first=30.0, peak=2.5, loss=1.25):
  return dict(times=times, first=first, peak_gib=peak, loss=loss)


def test_the_speedup_is_the_earlier_median_over_this_median():
  runs = {
    "against": [one([9.0, 10.0, 30.0]), one([11.0, 12.0, 8.0], peak=2.75)],
    "this": [one([4.0, 6.0, 5.0]), one([5.5, 4.5, 20.0], first=40.0)],
  }
  result = warm_start.summary(runs)
  # Medians of six calls each: (10 + 11) / 2 and (5 + 5.5) / 2.
  assert result["seconds"] == {"against": 10.5, "this": 5.25}
  assert result["speedup"] == 2.0
  lines = warm_start.table(result).splitlines()
  assert lines[2] == "| step, s (median of 6 calls) | 10.50 | 5.25 |"
  assert lines[3] == "| first call (compile), s | 30.0 | 35.0 |"
  assert lines[4] == "| peak RSS, GiB | 2.75 | 2.50 |"
  assert lines[5] == "| first loss | 1.2500 | 1.2500 |"
  assert lines[6] == "| speedup | | 2.00x |"
