"""Tests for ``rayfl.report``."""
