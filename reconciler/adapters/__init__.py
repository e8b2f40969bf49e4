"""Adapters: the outside world (Vast API, SSH, git) behind the ports in ``reconciler.ports``."""
