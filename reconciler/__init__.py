"""rigsync: a Git-native GitOps reconciler for rented, disposable GPUs on Vast.ai."""

__version__ = "0.1.0"
