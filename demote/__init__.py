"""The shared, framework-free core of demote."""
