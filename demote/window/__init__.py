"""The active window, pure: policies, the planner, turns and steps, clearing, tokens.

No I/O, no clocks, no locks, no framework imports.
"""
