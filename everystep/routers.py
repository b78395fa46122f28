"""A database router for a project that keeps everystep's tables in a database
of their own (``EVERYSTEP_DATABASE`` naming an alias other than ``"default"``).

The engine sends every query to that alias whatever the routers say; this
router is what ``migrate`` needs: everystep's tables are created there and
nowhere else, and that database holds nothing but them. A project that shares
the alias with other apps writes its own router instead.
"""

from django.db import DEFAULT_DB_ALIAS

from . import database

APP_LABEL = "everystep"


class EverystepRouter:
    def db_for_read(self, model, **hints):
        return database.alias() if model._meta.app_label == APP_LABEL else None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        if obj1._meta.app_label == APP_LABEL and obj2._meta.app_label == APP_LABEL:
            return True
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        engine_db = database.alias()
        if app_label == APP_LABEL:
            return db == engine_db
        if db == engine_db and engine_db != DEFAULT_DB_ALIAS:
            return False
        return None
