"""The queue's cards: Jinja2 templates rendered by reviews/card_html.py."""

from __future__ import annotations

from typing import Any

from django import template
from django.template import Context
from django.utils.safestring import SafeString

from reviews import card_html
from reviews.cards import Card, OnScreen
from reviews.groups import Group

register = template.Library()


@register.simple_tag(takes_context=True)
def review_card(context: Context, card: Card) -> SafeString:
    return card_html.card(card, context)


@register.simple_tag(takes_context=True)
def review_cards(context: Context, items: list[Card | OnScreen]) -> SafeString:
    return card_html.cards(items, context)



@register.simple_tag(takes_context=True)
def review_groups(context: Context, items: list[Group | Card]) -> SafeString:
    return card_html.groups(items, context)


@register.simple_tag(takes_context=True)
def review_batch_answer(context: Context, answer: Any) -> SafeString:
    return card_html.groups(answer.items, context, results=answer.results, line=answer.line, key=answer.key)

@register.simple_tag(takes_context=True)
def review_claim(context: Context, card: Card) -> SafeString:
    return card_html.claim(card, context)
