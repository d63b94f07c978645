"""distlab: plan, simulate, launch and measure distributed deep-learning training from a notebook.

Heavy parts (torch, dask, plotly, ipywidgets) are imported on first use, so
``import distlab`` stays fast and planning never pulls in a cluster.
"""

from __future__ import annotations

import importlib as _importlib
from typing import Any as _Any

from distlab.errors import DistlabError
from distlab.profiling.model_profile import DEFAULT_BATCH as _DEFAULT_BATCH
from distlab.profiling.model_profile import LayerProfile, ModelProfile, VariableProfile
from distlab.resources import Link, ResourceSpec
from distlab.strategy.types import Strategy

__version__ = "0.1.0"

# name -> (module, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "strategy": ("distlab.strategy", None),
    "topology": ("distlab.topology", None),
    "whatif": ("distlab.whatif", None),
    "sched": ("distlab.sched", None),
    "zoo": ("distlab.zoo", None),
    "data": ("distlab.data", None),
    "CostModel": ("distlab.costmodel", "CostModel"),
    "Prediction": ("distlab.costmodel", "Prediction"),
    "Lab": ("distlab.lab", "Lab"),
    "Run": ("distlab.runs.run", "Run"),
    "TrainContext": ("distlab.runtime.own_loop", "TrainContext"),
    "plot": ("distlab.notebook.plots", None),
    "StrategyPicker": ("distlab.notebook.picker", "StrategyPicker"),
}

__all__ = [
    "DistlabError",
    "LayerProfile",
    "Link",
    "ModelProfile",
    "ResourceSpec",
    "Strategy",
    "VariableProfile",
    "load_ipython_extension",
    "profile",
    *_LAZY,
]


def __getattr__(name: str) -> _Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'distlab' has no attribute {name!r}") from None
    mod = _importlib.import_module(module)
    value = mod if attr is None else getattr(mod, attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (lazy ones included, none imported by listing them) and the module's dunders."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})


def profile(
    model: _Any, sample_input: _Any = None, batch_size: int = _DEFAULT_BATCH, **options: _Any
) -> ModelProfile:
    """Profile a torch ``nn.Module`` (or a Keras model): see ``distlab.profiling.torch_profiler.profile``.

    The profilers live in ``distlab.profiling``, so ``dl.profile`` (this function) and the
    package never share a name.
    """
    from distlab.profiling.torch_profiler import profile as _profile

    return _profile(model, sample_input=sample_input, batch_size=batch_size, **options)


def load_ipython_extension(ipython: _Any) -> None:
    """``%load_ext distlab``: register the ``%distlab`` magic."""
    from distlab.notebook.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: _Any) -> None:
    from distlab.notebook.magics import unload_ipython_extension as _unload

    _unload(ipython)


def _register_in_ipython() -> None:
    """Inside IPython (any kernel: Colab, VS Code, a plain "Python 3"), ``import distlab`` registers
    ``%distlab``, as ``%load_ext distlab`` does; once per shell, silently. Outside IPython, nothing
    (IPython is not imported for it)."""
    import sys

    ipython_module = sys.modules.get("IPython")
    shell = getattr(ipython_module, "get_ipython", lambda: None)() if ipython_module else None
    if shell is not None and hasattr(shell, "register_magics"):
        load_ipython_extension(shell)


_register_in_ipython()
