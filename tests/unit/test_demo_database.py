"""scripts/demo's database name: configurable, so two checkouts sharing one PostgreSQL do
not drop each other's database, and checked, because it goes into DDL."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

DRIVER = Path(__file__).resolve().parents[2] / "scripts" / "lib" / "demo_driver.py"


@pytest.fixture(scope="module")
def driver() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("demo_driver_under_test", DRIVER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while defined
    # Run as a script, its own directory is on the path (it imports seaweedfs.py from there).
    sys.path.insert(0, str(DRIVER.parent))
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
        sys.path.remove(str(DRIVER.parent))


def test_the_demo_database_defaults_to_aivedio_demo(driver: ModuleType) -> None:
    assert driver.database_name({}) == "aivedio_demo"
    assert driver.database_name({"AIVEDIO_DEMO_DATABASE": " "}) == "aivedio_demo"


def test_aivedio_demo_database_names_another(driver: ModuleType) -> None:
    assert driver.database_name({"AIVEDIO_DEMO_DATABASE": "aivedio_demo_b"}) == "aivedio_demo_b"


@pytest.mark.parametrize("name", ['x"; DROP DATABASE postgres; --', "Demo", "1demo", "a" * 64])
def test_a_name_that_is_not_a_plain_identifier_is_refused(driver: ModuleType, name: str) -> None:
    with pytest.raises(driver.DemoError, match="AIVEDIO_DEMO_DATABASE"):
        driver.database_name({"AIVEDIO_DEMO_DATABASE": name})
