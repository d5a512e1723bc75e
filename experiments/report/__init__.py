"""Use 4: the report of a user's own sweep (`ddpbench report FILE`): findings with their tests, a table,
figures, and an HTML page."""
