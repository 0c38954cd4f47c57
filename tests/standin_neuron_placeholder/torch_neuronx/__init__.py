"""A stand-in of PyPI's ``torch-neuronx`` 1.0 (2022), used ONLY by the suite's tests.

That release is a placeholder: its ``__init__.py`` raises at import, pointing at the Neuron
SDK's own package index (``pip download torch-neuronx==1.0`` and read it). A new user who
types ``pip install torch-neuronx`` gets it; the suite must say so, not try to run it.
"""
raise ImportError("WRONG PACKAGE. Please install the package from Neuron Repository - "
                  "pip.repos.neuron.amazonaws.com")
