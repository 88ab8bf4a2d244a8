"""Bring-your-own model and data examples: factories that ``model.name: custom`` / ``data.name: custom`` import."""
