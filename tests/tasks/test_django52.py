"""On Django 5.2 the Tasks backend is refused clearly: django.tasks is 6.0's."""

import django
import pytest
from django.core import checks
from django.test import override_settings

pytestmark = pytest.mark.skipif(django.VERSION >= (6, 0), reason="Django 6 has django.tasks")

EVERYSTEP_TASKS = {"default": {"BACKEND": "everystep.tasks.EverystepBackend"}}


def test_importing_the_backend_names_the_django_version_it_needs():
    with pytest.raises(ImportError, match=r"needs Django 6\.0 or later .* this is Django 5\.2"):
        import everystep.tasks  # noqa: F401


def test_a_system_check_refuses_everystep_tasks_on_django_52():
    with override_settings(TASKS=EVERYSTEP_TASKS):
        errors = [e for e in checks.run_checks() if e.id == "everystep.E005"]
    assert len(errors) == 1
    assert "needs Django 6.0 or later" in errors[0].msg
    assert not [e for e in checks.run_checks() if e.id == "everystep.E005"]
