"""``sky.plugins``: environment setup and execution wrappers composed per pool.

``sky.Compute(..., plugins=[sky.plugins.torch(), my_plugin])``. A ``Plugin`` is a name and
seven optional hooks (see ``Plugin`` and docs/guides/distributed-training.md); the built-ins
below are plugins too.
"""

from __future__ import annotations

from skyward_iac.api.plugin import Cluster, LaunchCommand, LaunchContext, Plugin
from skyward_iac.plugins._accelerate import accelerate
from skyward_iac.plugins._gpu import cuml, mig, mps
from skyward_iac.plugins._jax import jax, keras
from skyward_iac.plugins._joblib import joblib, sklearn
from skyward_iac.plugins._torch import torch

__all__ = [
    "Cluster", "LaunchCommand", "LaunchContext", "Plugin", "accelerate", "cuml", "jax",
    "joblib", "keras", "mig", "mps", "sklearn", "torch",
]
