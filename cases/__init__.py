"""The variant catalog: cases as data (model), variants as mods (variants), matrices (catalog)."""
from cases.model import Case, Shape, Variant

__all__ = ["Case", "Shape", "Variant"]
