"""Notebooks-as-scripts (jupytext percent format): one per experiment of the paper, plus the report."""
