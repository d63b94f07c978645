"""Model profiling: what distribution needs to know about a model."""

from distlab.profiling.model_profile import LayerProfile, ModelProfile, VariableProfile, dtype_bytes

__all__ = ["LayerProfile", "ModelProfile", "VariableProfile", "dtype_bytes"]
