"""Model profiling: what distribution needs to know about a model.

``model_profile`` the ``ModelProfile`` type (variables, layers, gradient-ready order);
``torch_profiler`` and ``torch_meter`` profile a torch module (FLOPs counted, time measured per
layer), ``torch_inputs`` infer a sample input; ``keras_profiler`` a Keras model.
"""

from distlab.profiling.model_profile import LayerProfile, ModelProfile, VariableProfile, dtype_bytes

__all__ = ["LayerProfile", "ModelProfile", "VariableProfile", "dtype_bytes"]
