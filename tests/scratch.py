"""Throwaway Python modules for a test, written under its ``tmp_path``."""

import importlib
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from everystep import registry
from everystep.api import workflow


class ScratchModules:
    """``write("name.py", source)`` makes module ``name`` importable; names
    start with ``prefix`` so that no two tests share a module."""

    def __init__(self, root: Path):
        self.root = root
        self.prefix = f"scratch_{uuid.uuid4().hex[:8]}"

    def write(self, relative: str, source: str) -> Path:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        return path

    def app(self, source: str) -> str:
        """An installable app ``<prefix>_app`` whose ``workflows`` module holds ``source``."""
        name = f"{self.prefix}_app"
        self.write(f"{name}/__init__.py", "")
        self.write(f"{name}/workflows.py", source)
        return name

    def settings_with(self, app: str) -> str:
        """A settings module: the test settings plus ``app`` in INSTALLED_APPS."""
        name = f"{self.prefix}_settings"
        self.write(
            f"{name}.py",
            f"from tests.settings import *  # noqa: F403\n"
            f"INSTALLED_APPS = [*INSTALLED_APPS, {app!r}]  # noqa: F405\n",
        )
        return name


@pytest.fixture
def scratch_modules(tmp_path, monkeypatch):
    """Modules importable for this test only. Afterwards they leave ``sys.modules``
    and the registry forgets what they registered and how they failed."""
    root = tmp_path / "modules"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # a rewritten file is read again
    monkeypatch.setattr(registry, "_workflows", dict(registry._workflows))
    monkeypatch.setattr(registry, "_steps", dict(registry._steps))
    monkeypatch.setattr(registry, "_import_failures", {})
    modules = ScratchModules(root)
    yield modules
    for name in [name for name in sys.modules if name.startswith(modules.prefix)]:
        del sys.modules[name]


@pytest.fixture
def cron_workflow(scratch_modules):
    """``cron_workflow(name, cron=..., timezone=...)``: a workflow registered for
    this test only (the registry forgets it afterwards, so no other test's
    worker starts its slots). It returns the slot it was called with, as ISO text."""

    def declare(name="report", **options):
        def body(slot):
            return slot.isoformat()

        body.__name__ = body.__qualname__ = name
        body.__module__ = f"{scratch_modules.prefix}.flows"
        return workflow(**options)(body)

    return declare
