"""Finite value classes F = F_1 x ... x F_H for DP-GFA, and their incrementally updated losses."""
from dppo.function_classes.base import FiniteClass, TensorClass
from dppo.function_classes.context_bits import ContextBitsClass
from dppo.function_classes.linear_grid import LinearGridClass

__all__ = ["FiniteClass", "TensorClass", "ContextBitsClass", "LinearGridClass"]
