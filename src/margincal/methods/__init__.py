"""Unlearning objectives behind one registry (see :mod:`margincal.methods.base`)."""

from margincal.methods import gradient, preference
from margincal.methods.base import METHODS, UnlearningMethod, get_method, register

__all__ = ["METHODS", "UnlearningMethod", "get_method", "register", "gradient", "preference"]
