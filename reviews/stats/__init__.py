"""How reviewing goes (`/reviews/stats/`): what waits, who decided, how long decisions
take, what escalated or lapsed, shadow rules' agreement, and approval fatigue.

Every figure is an aggregate the database computes over the approvals decided in the
window (`decided_at`), on the approvals the viewer may see (agents/access.py). Time to
decision is `decided_at - created_at` of the calls a person answered (approved or
rejected); its percentiles are PostgreSQL's `percentile_cont`, and on SQLite (the
embedded default, which has none) the same interpolation over the durations read back
(to the millisecond, which is what SQLite's date functions count).

By concern: page.py (`stats()`: every figure for one viewer), windows.py (the window
and its exact figures), tallied.py (the same from the daily tallies), timing.py (time to
decision), events.py (escalations, lapsed claims), fatigue.py (streaks and draft
rules), figures.py (what the template reads). The rows and the fold that keeps them
live below, where the sweeper reaches them: agents/models/review_stats.py
(ReviewTally, ReviewTiming, ReviewStreak), agents/ops/review_tally.py (the fold) and the pure
agents/engine/streaks.py and drafts.py. The chart's HTML is
reviews/jinja2/reviews/chart.html, through reviews/templatetags/review_stats.py.

The page's door (reviews/views.py) needs only the names below.
"""

from __future__ import annotations

from .figures import Chart, Stats
from .page import stats
from .windows import DEFAULT_DAYS, WINDOWS, BadWindow, window_days

__all__ = ["DEFAULT_DAYS", "WINDOWS", "BadWindow", "Chart", "Stats", "stats", "window_days"]
