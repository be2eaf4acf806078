"""The review statistics' chart: a Jinja2 template (reviews/jinja2/reviews/chart.html)."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from agents.web.jinja import fragment
from reviews.stats import Chart

register = template.Library()


@register.simple_tag
def review_chart(chart: Chart) -> SafeString:
    """The chart and its table: a point, a dot and a row a day."""
    return fragment("reviews/chart.html", {"c": chart})
