"""URL fields' forms choose Django 6's https default now: no RemovedInDjango60Warning
from any form the admin or a ModelForm builds (#47, item 6)."""

from __future__ import annotations

import warnings

import pytest
from django.apps import apps
from django.db import models
from django.forms import modelform_factory

URL_FIELDS = [
    (model, field.name)
    for model in apps.get_app_config("agents").get_models()
    for field in model._meta.get_fields()
    if isinstance(field, models.URLField)
]


def test_every_url_field_is_found() -> None:
    assert len(URL_FIELDS) >= 4


@pytest.mark.parametrize(("model", "name"), URL_FIELDS, ids=lambda v: getattr(v, "__name__", v))
def test_a_url_fields_form_warns_nothing_and_assumes_https(model, name) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        form_class = modelform_factory(model, fields=[name])
    assert form_class.base_fields[name].to_python("example.org/hook") == "https://example.org/hook"
