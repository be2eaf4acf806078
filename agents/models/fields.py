"""Model fields shared by the models of several subjects."""

from __future__ import annotations

from typing import Any

from django.db import models


class URLField(models.URLField):
    """A URL field whose forms (the admin's, any ModelForm) read a bare `example.org` as
    `https://example.org`: Django 6's default, chosen now, which also silences Django
    5.2's RemovedInDjango60Warning about `assume_scheme` on every form built."""

    def formfield(self, **kwargs: Any) -> Any:
        return super().formfield(**{"assume_scheme": "https", **kwargs})

    def deconstruct(self) -> Any:
        # Migrations see Django's own URLField: this class changes forms, not the column.
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.URLField", args, kwargs
