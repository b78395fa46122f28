"""everystep_ui's system checks."""

from django.test import override_settings

from everystep_ui.checks import check_htmx, check_read_database


def ids(errors):
    return [error.id for error in errors]


def test_the_test_settings_pass():
    assert check_htmx(None) == []


def test_missing_htmx_middleware_is_an_error():
    with override_settings(MIDDLEWARE=["django.contrib.sessions.middleware.SessionMiddleware"]):
        errors = check_htmx(None)
    assert ids(errors) == ["everystep_ui.E002"]
    assert "django_htmx.middleware.HtmxMiddleware" in errors[0].hint


def test_missing_django_htmx_app_is_an_error(settings):
    apps = [app for app in settings.INSTALLED_APPS if app != "django_htmx"]
    with override_settings(INSTALLED_APPS=apps):
        errors = check_htmx(None)
    assert ids(errors) == ["everystep_ui.E001"]
    assert '"django_htmx"' in errors[0].hint


def test_the_check_is_registered():
    from django.core.checks import registry

    assert check_htmx in registry.registry.get_checks()


def test_an_unknown_read_database_is_an_error():
    assert check_read_database(None) == []
    with override_settings(EVERYSTEP_UI_READ_DATABASE="replica"):
        errors = check_read_database(None)
    assert ids(errors) == ["everystep_ui.E003"]
    assert "'replica'" in errors[0].msg
    with override_settings(EVERYSTEP_UI_READ_DATABASE="default"):
        assert check_read_database(None) == []
