"""Demotion hooks: where demoted messages go."""
