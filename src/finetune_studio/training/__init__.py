"""The training child (its own process): the recipe, callbacks, models, datasets.

The only package that imports torch, transformers, peft and trl; never FastAPI.
"""
