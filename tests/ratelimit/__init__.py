"""Helpers shared by the rate-limit and breaker contract tests."""
