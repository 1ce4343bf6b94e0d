"""Helpers the tests import: real processes through the harness, rows, requests, streams.

Fixtures stay in conftest modules; everything a test imports lives here.
"""
