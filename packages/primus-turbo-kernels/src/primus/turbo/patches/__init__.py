"""Patches that install turbo kernels into backends (entry points `primus.patches`).

Each module registers its backend's `turbo.*` switches and patches; kernels, torch and the
upstream are imported only inside the handlers.
"""
