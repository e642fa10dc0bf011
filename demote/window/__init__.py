"""The active window, pure: policies, the planner, turns and steps, clearing, the note, tokens.

Everything that decides the window lives here: :mod:`~demote.window.policy`,
:mod:`~demote.window.planner` with its turn and step index (:mod:`~demote.window.groups`)
and arithmetic (:mod:`~demote.window.steps`), :mod:`~demote.window.clearing`,
:mod:`~demote.window.pairing`, the note a cut leaves (:mod:`~demote.window.digest`), and
counting (:mod:`~demote.window.tokens`, :mod:`~demote.window.media`). No I/O, no clocks,
no locks, no framework imports.
"""
