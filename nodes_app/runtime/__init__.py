"""The node runtime: a shard of a causal LM held in torch and served over HTTP.

Everything under this package may import torch and transformers; nothing else
in the project may (the tracker never loads them). Importing the package
itself is cheap: the heavy modules are imported by the modules that use them.
"""
