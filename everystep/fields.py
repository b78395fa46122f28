from django.db import models

from . import serde


class EverystepJSONField(models.JSONField):
    """``JSONField`` storing values through :mod:`everystep.serde` (jsonb on PostgreSQL)."""

    def get_prep_value(self, value):
        if value is None:
            return None
        return super().get_prep_value(serde.encode(value))

    def from_db_value(self, value, expression, connection):
        value = super().from_db_value(value, expression, connection)
        return None if value is None else serde.decode(value)
