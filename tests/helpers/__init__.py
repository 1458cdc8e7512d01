"""Test helpers: a package the tests import from (never from conftest)."""
