"""INT4 matmul on the AutoAWQ GEMM layout. Pure functions on tensors; no model knowledge."""

from .reference import dequantize, int4_linear

__all__ = ["dequantize", "int4_linear"]
