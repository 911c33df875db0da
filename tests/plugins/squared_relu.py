"""Squared ReLU (So et al. 2021) as a plug-in activation: the ReLU projection, squared; not a proximal map."""

import sympy as sp

from splitformer import register_activation
from splitformer.symbolic.activations import V

register_activation("squared-relu", sp.Max(V, 0) ** 2, "squared ReLU: the projection onto S_2, squared", proximal=False)
