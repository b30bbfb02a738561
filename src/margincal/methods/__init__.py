"""Unlearning objectives behind one registry (see :mod:`margincal.methods.base`)."""

from margincal.methods import defenses, distill, gradient, preference
from margincal.methods.base import METHODS, UnlearningMethod, get_method, register

METHODS.freeze()  # every method module above has registered its methods

__all__ = ["METHODS", "UnlearningMethod", "get_method", "register", "defenses", "distill", "gradient", "preference"]
