"""Compatibility: the module paths the original Primus's backend guide imports from.

New code imports from `primus.core.logging` instead; see `module_utils`.
"""
